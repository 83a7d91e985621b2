"""A hand-written vLLM with the token-in endpoints (`--enable-scale-out`), for fault injection on the token chain.

It serves what the chain calls (`/openapi.json`, `/v1/models`, `/detokenize`, the render, generate
streamed or not, the derender streamed or not) in the shapes vLLM 0.31 gives them. Every message
renders as a few ids, an echoed answer as the ids it was sampled as (within its turn's header and
close), so a follow-up that sends the answer back is bridged. Its model card can leave out
`max_model_len`, and its non-streamed derender (the whole answer's, after a stream) can fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

CLOSE = [2, 107]
ANSWER_IDS = [*range(300, 323), CLOSE[0]]
"""What generate samples: 24 ids, more than SamplingParams' default of 16, the last its end of turn."""
ANSWER = "word " * (len(ANSWER_IDS) - 1)
OPENER = [1, 435, 107]
"""The generation prompt (an assistant turn's header)."""
CONTEXT = 4096
PATHS = ["/v1/chat/completions/render", "/inference/v1/generate", "/v1/chat/completions/derender"]


def _prompt(messages: list[dict[str, Any]]) -> list[int]:
    ids: list[int] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") == "assistant" and content in ("a", "b"):
            ids += [*OPENER, 35 if content == "a" else 36, *CLOSE]  # the turn-close probe
        elif message.get("role") == "assistant" and content == ANSWER:
            ids += [*OPENER, *ANSWER_IDS[:-1], *CLOSE]
        else:
            ids += [1, 10 + i, 11 + i, *CLOSE]
    return ids


@dataclass
class FakeChainEngine:
    """State shared by the fake engine and the test that drives it."""

    max_model_len: int | None = CONTEXT
    """On the model card; None leaves it out."""
    whole_derender_status: int = 200
    """What a non-streamed derender answers: 200, or an error status (500: the engine failed, 400: refused)."""
    requests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """The JSON bodies received, by path."""

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/openapi.json", self._openapi),
                Route("/v1/models", self._models),
                Route("/detokenize", self._post, methods=["POST"]),
                *(Route(path, self._post, methods=["POST"]) for path in PATHS),
            ]
        )

    async def _openapi(self, request: Request) -> Response:
        return JSONResponse({"paths": {path: {} for path in PATHS}})

    async def _models(self, request: Request) -> Response:
        card: dict[str, Any] = {"id": "tiny", "object": "model"}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return JSONResponse({"object": "list", "data": [card]})

    async def _post(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        path = request.url.path
        self.requests.setdefault(path, []).append(body)
        if path == "/detokenize":
            return JSONResponse({"prompt": "</s>\n"})
        if path == "/v1/chat/completions/render":
            return JSONResponse(_render(body))
        if path == "/inference/v1/generate":
            return _generate(body)
        if body.get("stream"):
            return JSONResponse(_derender_chunk(body))
        if self.whole_derender_status != 200:
            error = {"error": {"message": "derender failed", "type": "InternalServerError", "code": 500}}
            return JSONResponse(error, status_code=self.whole_derender_status)
        return JSONResponse(_derender(body))


def _render(request: dict[str, Any]) -> dict[str, Any]:
    ids = _prompt(request.get("messages") or [])
    if request.get("add_generation_prompt", True):
        ids += OPENER
    limit = request.get("max_completion_tokens") or request.get("max_tokens")
    # As vLLM's render: without a limit, what the context leaves after the prompt.
    sampling = {"temperature": 1.0, "max_tokens": limit if isinstance(limit, int) else CONTEXT - len(ids)}
    return {"request_id": "chatcmpl-fake", "token_ids": ids, "sampling_params": sampling, "model": "tiny"}


def _sampled(sampling: dict[str, Any], prompt_len: int) -> tuple[list[int], str]:
    # As vLLM's generate: without max_tokens, the rest of the context.
    limit = sampling.get("max_tokens", CONTEXT - prompt_len)
    ids = ANSWER_IDS[:limit]
    return ids, "length" if len(ids) < len(ANSWER_IDS) else "stop"


def _generate(body: dict[str, Any]) -> Response:
    ids, finish = _sampled(body["sampling_params"], len(body["token_ids"]))
    if not body.get("stream"):
        choice = {"index": 0, "token_ids": ids, "finish_reason": finish, "logprobs": None}
        return JSONResponse({"request_id": "gen-fake", "model": "tiny", "choices": [choice]})

    async def chunks() -> Any:
        for at in range(0, len(ids), 8):
            last = at + 8 >= len(ids)
            part = {"index": 0, "token_ids": ids[at : at + 8], "finish_reason": finish if last else None}
            yield b"data: " + orjson.dumps({"request_id": "gen-fake", "choices": [part]}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")


def _derender(body: dict[str, Any]) -> dict[str, Any]:
    choices = [
        {
            "index": c["index"],
            "message": {"role": "assistant", "content": "word " * len(c["token_ids"]), "tool_calls": []},
            "logprobs": None,
            "finish_reason": c["finish_reason"],
        }
        for c in body["generate_response"]["choices"]
    ]
    prompt_tokens = body.get("prompt_tokens") or 0
    completion = sum(len(c["token_ids"]) for c in body["generate_response"]["choices"])
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": "tiny",
        "choices": choices,
        "usage": usage,
    }


def _derender_chunk(body: dict[str, Any]) -> dict[str, Any]:
    [part] = body["generate_chunk"]["choices"]
    delta = {"content": "word " * len(part["token_ids"])}
    state = body.get("stream_state") or {}
    if not state.get("role_sent"):
        delta["role"] = "assistant"
    choice = {"index": 0, "delta": delta, "finish_reason": part.get("finish_reason")}
    chunk = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "tiny",
        "choices": [choice],
    }
    return {"chunk": chunk, "stream_state": {**state, "role_sent": True}}
