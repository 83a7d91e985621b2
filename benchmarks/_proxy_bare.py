"""The floor for any proxy: forward bytes with one shared httpx client, parse nothing, record nothing.

python benchmarks/_proxy_bare.py PORT BACKEND_BASE_URL
"""

from __future__ import annotations

import sys

import httpx
import uvicorn


def make_app(backend: str):  # type: ignore[no-untyped-def]
    """The pass-through ASGI app to `backend` (an OpenAI base URL ending in /v1)."""
    backend = backend.rstrip("/")
    clients: list[httpx.AsyncClient] = []  # made in the lifespan, like agl's

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    clients.append(httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None)))
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await clients[0].aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await forward(clients[0], backend, scope, receive, send)

    return app


async def forward(client: httpx.AsyncClient, backend: str, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["method"] == "GET":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    path = scope["path"].removeprefix("/v1")
    request = client.build_request("POST", backend + path, content=body, headers={"content-type": "application/json"})
    response = await client.send(request, stream=True)
    try:
        content_type = response.headers.get("content-type", "application/json")
        headers = [(b"content-type", content_type.encode())]
        if not content_type.startswith("text/event-stream"):
            # One write with a length, as agl does for non-streamed answers.
            data = await response.aread()
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            await send({"type": "http.response.body", "body": data})
            return
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        await response.aclose()


if __name__ == "__main__":
    uvicorn.run(make_app(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
