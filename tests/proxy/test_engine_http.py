"""The token chain's HTTP client (`EngineHttp`) against real servers: uvicorn as vLLM runs it,
and raw asyncio servers that misbehave on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from agl_proxy.chain.engine_http import EngineHttp

from .helpers import serve

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers a POST with its JSON body, the client's port and the request headers; chunked on /chunked."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = (await receive())["body"]  # a small body comes whole
    answer = json.dumps(
        {
            "body": json.loads(body),
            "client_port": scope["client"][1],
            "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
            "path": scope["path"] + ("?" + scope["query_string"].decode() if scope["query_string"] else ""),
        }
    ).encode()
    status = 404 if scope["path"] == "/missing" else 200
    if scope["path"] == "/chunked":
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        half = len(answer) // 2
        await send({"type": "http.response.body", "body": answer[:half], "more_body": True})
        await send({"type": "http.response.body", "body": answer[half:]})
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@contextlib.asynccontextmanager
async def _raw_server(handle: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(v) for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")) if k == b"content-length"
    )
    return await reader.readexactly(length)


async def test_posts_json_and_keeps_the_connection_alive() -> None:
    http = EngineHttp()
    try:
        async with serve(_echo) as url:
            answers = []
            for path in ("/render?x=1", "/chunked"):
                status, headers, data = await http.fetch(
                    "POST", url + path, content=b'{"a": [1, 2]}', headers={"x-rollout-id": "ro-1"}, timeout=10
                )
                assert status == 200 and headers["content-type"] == "application/json"
                answers.append(json.loads(data))
            assert [a["body"] for a in answers] == [{"a": [1, 2]}, {"a": [1, 2]}]
            assert answers[0]["path"] == "/render?x=1"
            assert answers[0]["headers"]["x-rollout-id"] == "ro-1"
            assert answers[0]["headers"]["host"] == url.removeprefix("http://")
            # Both requests went over one connection, which stays open for the next.
            assert answers[0]["client_port"] == answers[1]["client_port"]
            assert http.idle_connections == 1
            status, _, data = await http.fetch("POST", url + "/missing", content=b"{}", timeout=10)
            assert status == 404 and json.loads(data)["body"] == {}
            # A request in flight when the client closes: its connection is closed after it, not kept.
            in_flight = asyncio.ensure_future(http.fetch("POST", url + "/render", content=b"{}", timeout=10))
            await asyncio.sleep(0)
            await http.aclose()
            assert (await in_flight)[0] == 200 and http.idle_connections == 0
            await http.fetch("POST", url + "/render", content=b"{}", timeout=10)  # usable again
            assert http.idle_connections == 1
    finally:
        await http.aclose()
    assert http.idle_connections == 0


async def test_a_kept_alive_connection_the_server_closed_is_replaced() -> None:
    """The server closes each connection after its answer without saying so (as when its
    keep-alive ran out meanwhile): the next request goes once more on a new connection."""

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    http = EngineHttp()
    try:
        async with _raw_server(once) as url:
            for n in range(3):
                await asyncio.sleep(0.05)  # the server's close arrives
                assert (await http.fetch("POST", url, content=b'{"n": %d}' % n, timeout=5))[2] == b'{"n": %d}' % n
    finally:
        await http.aclose()


async def test_connection_errors_are_httpx_errors() -> None:
    http = EngineHttp()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await reader.read()  # until the client gives up and closes
        writer.close()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"partial')
        await writer.drain()
        writer.close()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        writer.close()

    try:
        async with _raw_server(silent) as url:
            with pytest.raises(httpx.ReadTimeout):
                await http.fetch("POST", url, content=b"{}", timeout=0.2)
        async with _raw_server(cut) as url:
            with pytest.raises(httpx.RemoteProtocolError, match="mid-answer"):
                await http.fetch("POST", url, content=b"{}", timeout=5)
        async with _raw_server(garbage) as url:
            with pytest.raises(httpx.RemoteProtocolError, match="not an HTTP/1.1 answer"):
                await http.fetch("POST", url, content=b"{}", timeout=5)
        closed_port = url.rsplit(":", 1)[1]
        with pytest.raises(httpx.ConnectError):
            await http.fetch("POST", f"http://127.0.0.1:{closed_port}/v1", content=b"{}", timeout=5)
        with pytest.raises(httpx.UnsupportedProtocol):
            await http.fetch("POST", "unix:///tmp/engine.sock", content=b"{}")
        with pytest.raises(httpx.LocalProtocolError, match="x-bad"):
            await http.fetch("POST", url, content=b"{}", headers={"x-bad": "a\r\nhost: evil"})
        assert http.idle_connections == 0  # no failed connection is kept
    finally:
        await http.aclose()
