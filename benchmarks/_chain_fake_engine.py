"""A fast fake vLLM with the token-in endpoints (`--enable-scale-out`) for chain_bench.py.

    python benchmarks/_chain_fake_engine.py PORT [ANSWER_IDS]     # 16 ids an answer by default

It answers `/v1/chat/completions` (vLLM's rendered path, `return_token_ids` fields) and, for the
token chain, `/openapi.json`, `/v1/models`, `/v1/chat/completions/render`, `/inference/v1/generate`
and `/v1/chat/completions/derender` (generate streamed too, an id a chunk, as vLLM streams it). Every
answer is the same text; prompt ids are 8 per message
and an echoed answer renders as its sampled ids (within its turn's header and close), so what a
proxy parses grows with the history as with a real model, and a bridged prompt is as long as the
rendered one. It costs little, so the
proxy's CPU dominates; it is not a model (its ids are not a tokenizer's).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter

import uvicorn
from _proxy_fake_backend import request_body

N_TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 16
IDS_PER_MESSAGE = 8
TOKEN_IDS = list(range(300, 300 + N_TOKENS))
CONTENT = "tok " * N_TOKENS
CLOSE = [2, 107]
OPENER = [1, 435, 107]
"""The generation prompt (an assistant turn's header)."""
PATHS = ["/v1/chat/completions/render", "/inference/v1/generate", "/v1/chat/completions/derender"]


def _prompt(messages: list[dict]) -> list[int]:
    ids = []
    for i, message in enumerate(messages):
        if message.get("role") == "assistant" and message.get("content") in ("a", "b"):
            ids += [1, 9, 35 if message["content"] == "a" else 36, *CLOSE]  # the turn-close probe
        elif message.get("role") == "assistant" and message.get("content") == CONTENT:
            # An echoed answer renders as the ids it was sampled as, as a real template's
            # does: the rendered prompt is then as long as the bridged one.
            ids += [*OPENER, *TOKEN_IDS, *CLOSE]
        else:
            ids += [1, *range(10 + i % 50, 10 + i % 50 + IDS_PER_MESSAGE - 3), *CLOSE]
    return ids


def _render(request: dict) -> dict:
    ids = _prompt(request.get("messages") or [])
    if request.get("add_generation_prompt", True):
        ids += OPENER
    sampling = {"temperature": request.get("temperature", 1.0), "max_tokens": request.get("max_tokens", 16)}
    return {"request_id": "chatcmpl-bench", "token_ids": ids, "sampling_params": sampling, "model": "bench"}


def _choice(**extra: object) -> dict:
    return {"index": 0, "logprobs": None, "finish_reason": "length", "token_ids": TOKEN_IDS, **extra}


def _answer(request: dict, path: str) -> object:
    if path == "/v1/chat/completions/render":
        return _render(request)
    if path == "/inference/v1/generate":
        return {"request_id": "gen-bench", "model": "bench", "choices": [_choice()]}
    message = {"role": "assistant", "content": CONTENT, "tool_calls": []}
    if path == "/v1/chat/completions/derender":
        prompt_tokens = request.get("prompt_tokens") or 0
        choices = [{"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}]
    else:
        prompt = _render(request)["token_ids"]
        prompt_tokens = len(prompt)
        choices = [_choice(message=message, stop_reason=None)]
    response = {
        "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()), "model": "bench",
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": N_TOKENS,
                  "total_tokens": prompt_tokens + N_TOKENS},
    }  # fmt: skip
    if path != "/v1/chat/completions/derender":
        response["prompt_token_ids"] = prompt
    return response


REQUESTS: Counter[str] = Counter()
"""POSTs answered, by path (`GET /requests`): how many engine requests a call made."""


async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/openapi.json":
        await _send(send, {"paths": {p: {} for p in PATHS}})
        return
    if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/requests":
        await _send(send, REQUESTS)
        return
    body = await request_body(scope, receive, send)  # a GET here is the model list
    if body is None:
        return
    if scope["type"] == "http" and scope["method"] == "POST":
        REQUESTS[scope["path"]] += 1
    request = json.loads(body or b"{}")
    if scope["path"] == "/inference/v1/generate" and request.get("stream"):
        await _stream_generate(send)
        return
    await _send(send, _answer(request, scope["path"]))


async def _stream_generate(send) -> None:  # type: ignore[no-untyped-def]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for i, token_id in enumerate(TOKEN_IDS):
        finish = "length" if i == len(TOKEN_IDS) - 1 else None
        part = {"index": 0, "token_ids": [token_id], "logprobs": None, "finish_reason": finish}
        chunk = {"request_id": "gen-bench", "choices": [part]}
        await send(
            {"type": "http.response.body", "body": b"data: " + json.dumps(chunk).encode() + b"\n\n", "more_body": True}
        )
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _send(send, value: object) -> None:  # type: ignore[no-untyped-def]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(value).encode()})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
