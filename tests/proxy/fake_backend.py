"""A hand-written OpenAI-compatible backend shaped like vLLM, for fault injection.

It answers chat and completion calls with vLLM's `return_token_ids` fields, streamed or
not, and can be told to hang, fail with a 500, answer garbage or drop a stream half-way.
It records the requests it received so tests can check what the proxy forwarded.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

WORDS = ["Hello", " from", " the", " fake", " backend", "."]


def fake_token_ids(text: str) -> list[int]:
    """A deterministic 'tokenization': one id per character."""
    return [ord(c) % 1000 for c in text]


def word_ids(words: list[str]) -> list[int]:
    return [100 + i for i, _ in enumerate(words)]


@dataclass
class FakeBackend:
    """State shared by the fake app and the test that drives it."""

    mode: str = "ok"
    """`ok`, `hang`, `error500`, `garbage`, `drop` (stream cut after two chunks), `reject400`,
    `internal404` (an HTML page, as an internal service that is no LLM backend answers)."""
    name: str = "fake"
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """With mode `hang`, calls wait for this event (or forever)."""
    chunk_delay_s: float = 0.0
    token_ids: str = "all"
    """What `return_token_ids` gets: `all`, `none` (as a backend that ignores the flag) or
    `short` (the last generated token's id left out, so fewer ids than usage counts)."""

    def ids_asked(self, body: dict[str, Any]) -> bool:
        return bool(body.get("return_token_ids")) and self.token_ids != "none"

    def prompt_ids(self, body: dict[str, Any]) -> list[int]:
        if "messages" in body:
            return fake_token_ids("".join(str(m.get("content") or "") for m in body["messages"]))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return list(prompt)
        return fake_token_ids(str(prompt))

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            return await self._answer(request, chat=True)

        async def completions(request: Request) -> Response:
            return await self._answer(request, chat=False)

        return Starlette(
            routes=[
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/completions", completions, methods=["POST"]),
            ]
        )

    async def _answer(self, request: Request, chat: bool) -> Response:
        body = orjson.loads(await request.body())
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.mode == "hang":
            await self.release.wait()
        if self.mode == "error500":
            return Response(
                b'{"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}',
                status_code=500,
                media_type="application/json",
            )
        if self.mode == "reject400":
            return Response(
                b'{"error": {"message": "prompt too long", "type": "BadRequestError", "code": 400}}',
                status_code=400,
                media_type="application/json",
            )
        if self.mode == "internal404":
            return Response(b"<html>internal-only page</html>", status_code=404, media_type="text/html")
        if self.mode == "garbage":
            return Response(b"<html>oops</html>", status_code=200, media_type="text/html")
        n = int(body.get("n") or 1)
        prompt_ids = self.prompt_ids(body)
        if body.get("stream"):
            return StreamingResponse(self._stream(body, chat, n, prompt_ids), media_type="text/event-stream")
        return Response(orjson.dumps(self._full(body, chat, n, prompt_ids)), media_type="application/json")

    def _full(self, body: dict[str, Any], chat: bool, n: int, prompt_ids: list[int]) -> dict[str, Any]:
        choices = []
        for i in range(n):
            choice: dict[str, Any] = {"index": i, "logprobs": None, "finish_reason": "stop", "stop_reason": None}
            if chat:
                choice["message"] = {
                    "role": "assistant",
                    "content": "".join(WORDS),
                    "tool_calls": [],
                    "reasoning_content": None,
                }
                if body.get("logprobs"):
                    choice["logprobs"] = {
                        "content": [{"token": w, "logprob": -0.5, "bytes": None, "top_logprobs": []} for w in WORDS]
                    }
            else:
                choice["text"] = "".join(WORDS)
                if body.get("logprobs") is not None:
                    choice["logprobs"] = {
                        "text_offset": list(range(len(WORDS))),
                        "token_logprobs": [-0.5] * len(WORDS),
                        "tokens": WORDS,
                        "top_logprobs": None,
                    }
                if self.ids_asked(body):
                    choice["prompt_token_ids"] = prompt_ids
            if self.ids_asked(body):
                choice["token_ids"] = word_ids(WORDS)[: -1 if self.token_ids == "short" else None]
            choices.append(choice)
        response: dict[str, Any] = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{self.name}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": n * len(WORDS),
                "total_tokens": len(prompt_ids) + n * len(WORDS),
            },
        }
        if chat and self.ids_asked(body):
            response["prompt_token_ids"] = prompt_ids
        return response

    async def _stream(self, body: dict[str, Any], chat: bool, n: int, prompt_ids: list[int]):
        ids = word_ids(WORDS)
        base = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{self.name}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": body["model"],
        }
        with_ids = self.ids_asked(body)
        if chat:
            first = {
                **base,
                "choices": [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                    for i in range(n)
                ],
            }
            if with_ids:
                first["prompt_token_ids"] = prompt_ids
                for c in first["choices"]:
                    c["token_ids"] = []
            yield b"data: " + orjson.dumps(first) + b"\n\n"
        for k, word in enumerate(WORDS):
            if self.mode == "drop" and k == 2:
                raise ConnectionResetError("the fake backend dropped the stream")
            for i in range(n):
                last = k == len(WORDS) - 1
                if chat:
                    choice: dict[str, Any] = {
                        "index": i,
                        "delta": {"content": word},
                        "logprobs": None,
                        "finish_reason": "stop" if last else None,
                    }
                    if body.get("logprobs"):
                        choice["logprobs"] = {
                            "content": [{"token": word, "logprob": -0.5, "bytes": None, "top_logprobs": []}]
                        }
                else:
                    choice = {
                        "index": i,
                        "text": word,
                        "logprobs": None,
                        "finish_reason": "stop" if last else None,
                        "stop_reason": None,
                    }
                    if with_ids and k == 0:
                        choice["prompt_token_ids"] = prompt_ids
                if with_ids and not (last and self.token_ids == "short"):
                    choice["token_ids"] = [ids[k]]
                yield b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n"
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": n * len(WORDS)}
            yield b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
        yield b"data: [DONE]\n\n"
