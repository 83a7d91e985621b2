"""A fast vLLM-shaped OpenAI backend for proxy_bench.py: fixed answers, as cheap as possible.

    python benchmarks/_proxy_fake_backend.py PORT

Raw ASGI (no framework) so the backend's own cost stays small and the proxy's cost
dominates what the load generator sees. Responses carry vLLM's `return_token_ids` fields;
streams send one chunk per token (16) like vLLM does.
"""

from __future__ import annotations

import json
import sys
import time

import uvicorn

N_TOKENS = 16
PROMPT_IDS = list(range(1, 201))
TOKEN_IDS = list(range(300, 300 + N_TOKENS))


def _chat(model: str) -> bytes:
    return json.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok " * N_TOKENS, "tool_calls": []},
                     "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": TOKEN_IDS}],
        "usage": {
            "prompt_tokens": len(PROMPT_IDS),
            "completion_tokens": N_TOKENS,
            "total_tokens": len(PROMPT_IDS) + N_TOKENS,
        },
        "prompt_token_ids": PROMPT_IDS, "prompt_logprobs": None, "kv_transfer_params": None,
    }).encode()  # fmt: skip


def _chunks(model: str) -> list[bytes]:
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    first = {**base, "prompt_token_ids": PROMPT_IDS, "choices": [{**choice, "token_ids": []}]}
    out = [b"data: " + json.dumps(first).encode() + b"\n\n"]
    for i, token in enumerate(TOKEN_IDS):
        last = i == N_TOKENS - 1
        choice = {
            "index": 0,
            "delta": {"content": "tok "},
            "logprobs": None,
            "finish_reason": "length" if last else None,
            "token_ids": [token],
        }
        out.append(b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


MODELS = b'{"object": "list", "data": [{"id": "bench", "object": "model"}]}'


async def request_body(scope, receive, send) -> bytes | None:  # type: ignore[no-untyped-def]
    """The POST body of an HTTP request; None once a lifespan or a GET (the model list) is answered."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return None
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["method"] == "GET":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": MODELS})
        return None
    return body


async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    body = await request_body(scope, receive, send)
    if body is None:
        return
    request = json.loads(body or b"{}")
    model = request.get("model", "bench")
    if request.get("stream"):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for chunk in _chunks(model):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": _chat(model)})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
