"""A streamed chat call on the token chain, answered as it is generated.

`/inference/v1/generate` streams the sampled ids; the engine's streamed derender
(`/v1/chat/completions/derender` with `stream: true`) turns them into chat deltas with its own
parsers, the state it needs carried from one request to the next. The ids that arrive while a
derender is in flight go to the next one as one chunk, so a long answer costs a few derenders,
not one per token: the state's `output_chunk_lens` records the chunks as they were sent, and
its parser replay splits them the same way, as it does for an engine step that samples several
ids (speculative decoding).

The client gets each choice's role and deltas (with their `token_ids`; `prompt_token_ids` on
the first chunk), then, once the answer is whole, the finish reasons and usage of the one
non-streamed derender the call's span and the chain record, so what the client is told ends
its answer is what the span says.

`sse_chunks` streams a whole answer instead, for `n` > 1, which vLLM 0.31's streamed generate
fails: per choice a role chunk, the reasoning, content and tool calls, then the finish reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..backends.base import Call, RetryableBackendError
from ..common.deployments import Deployment
from ..common.errors import ProxyError
from .continuation import Generation, Sampled, Sampler, Segments
from .engine import DERENDER, EngineRejected, ends_on_stop_token, post_json
from .engine_http import EngineHttp

SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]


class StreamFailed(Exception):
    """The stream broke after the client's answer began; `event` is what ends the client's stream."""

    def __init__(self, error_type: str, message: str, status: int, event: bytes) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.status = status
        self.event = event


@dataclass(slots=True)
class _Choice:
    """One choice as its ids arrive (`sampled`) and its deltas go out."""

    sampled: Sampled
    sent: int = 0
    """How many of the ids the streamed derender has had."""
    finished: bool = False
    """The streamed derender has had the finish."""
    state: Any = None

    def pending(self) -> bool:
        sampled = self.sampled
        return len(sampled.ids) > self.sent or (sampled.finish_reason is not None and not self.finished)


class ChainStream:
    """The client's side of one streamed chat call: `relay` streams the answer as it is
    generated (`continuation.Generation`: across the weight updates that stop it) and returns it
    as `/inference/v1/generate` answers a call that is not streamed; `finish` ends the client's
    stream with the whole answer's finish reasons and usage."""

    __slots__ = (
        "_first",
        "_prompt_ids",
        "call",
        "choices",
        "deployment",
        "headers",
        "include_usage",
        "request",
        "sampling",
        "sampler",
        "segments",
        "transport",
    )

    def __init__(
        self,
        call: Call,
        transport: EngineHttp,
        deployment: Deployment,
        headers: Mapping[str, str],
        prompt_ids: list[int],
        sampler: Sampler,
    ) -> None:
        self.call = call
        self.transport = transport
        self.deployment = deployment
        self.headers = headers
        self.sampler = sampler
        self.include_usage = bool((call.body.get("stream_options") or {}).get("include_usage"))
        # One choice: vLLM 0.31's streamed generate fails for n > 1; each choice would have its own state.
        self.choices: list[_Choice] = []
        self._prompt_ids = prompt_ids
        self._first = True
        self.request: dict[str, Any] = {}
        self.sampling: Mapping[str, Any] = {}
        self.segments: dict[int, Segments] = {}

    @property
    def started(self) -> bool:
        return not self._first

    async def relay(self, generate_body: Mapping[str, Any], chat_request: Mapping[str, Any]) -> dict[str, Any]:
        """Stream the generation to the client, its deltas parsed as the engine parses
        `chat_request`'s answer; the generated answer (`GenerateResponse`'s shape).

        Failures before the client's answer began raise as `post_json` does; after it,
        `StreamFailed`."""
        self.sampling = generate_body["sampling_params"]
        # What every streamed derender repeats, serialized once.
        self.request = {
            "stream": True,
            "model": self.deployment.model,
            "prompt_tokens": len(self._prompt_ids),
            # Its parsers need the prompt to see whether it left reasoning open.
            "prompt_token_ids": orjson.Fragment(orjson.dumps(self._prompt_ids)),
            "chat_request": orjson.Fragment(orjson.dumps(chat_request)),
        }
        generation = Generation(self.sampler, generate_body)
        choice = _Choice(generation.choice)
        self.choices = [choice]
        try:
            await self._relay(generation)
        except (EngineRejected, RetryableBackendError, ProxyError) as exc:
            if not self.started:
                raise
            raise stream_failure(exc) from exc
        self.segments = {choice.sampled.index: choice.sampled.segments}
        return {"request_id": generation.request_id, "choices": [choice.sampled.answer()]}

    async def _relay(self, generation: Generation) -> None:
        wake = generation.wake
        reader = asyncio.ensure_future(generation.run())
        try:
            while True:
                ready = [c for c in self.choices if c.pending()]
                if ready:
                    # The ids that came while the last derenders ran go out in one.
                    answers = await asyncio.gather(*(self._derender(c, generation.request_id) for c in ready))
                    for choice, (chunk, ids) in zip(ready, answers, strict=True):
                        await self._send_delta(choice, chunk, ids)
                    continue
                if reader.done():
                    reader.result()
                    return
                await wake.wait()
                wake.clear()
        finally:
            if not reader.done():
                reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _derender(self, choice: _Choice, request_id: str | None) -> tuple[dict[str, Any], list[int]]:
        sampled = choice.sampled
        ids = sampled.ids[choice.sent :]
        finish = sampled.finish_reason
        # The stop id comes with the finish; its text is not the answer's (`ends_on_stop_token`),
        # so the parser is not given it, and the client still gets the id.
        shown = ids[:-1] if ends_on_stop_token(sampled.ids, finish, self.sampling) else ids
        part = {"index": sampled.index, "token_ids": shown, "finish_reason": finish}
        body = {
            **self.request,
            "generate_chunk": {"request_id": request_id, "choices": [part]},
            "stream_state": choice.state,
        }
        answer = await post_json(self.transport, self.deployment, DERENDER, body, self.headers)
        choice.sent += len(ids)
        choice.finished = finish is not None
        choice.state = answer.get("stream_state")
        return answer.get("chunk") or {}, ids

    async def _send_delta(self, choice: _Choice, chunk: Mapping[str, Any], ids: list[int]) -> None:
        for part in chunk.get("choices") or ():
            delta = {k: v for k, v in (part.get("delta") or {}).items() if v is not None and v != []}
            out = {
                "index": choice.sampled.index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": None,
                "token_ids": ids,
            }
            await self._send(chunk, [out])

    async def _send(self, head: Mapping[str, Any], choices: list[dict[str, Any]], **extra: Any) -> None:
        call = self.call
        if self._first:
            extra["prompt_token_ids"] = self._prompt_ids
            await call.send({"type": "http.response.start", "status": 200, "headers": SSE})
            self._first = False
        await call.send({"type": "http.response.body", "body": _chunk(head, choices, **extra), "more_body": True})
        if call.record.ttft_s is None:
            call.record.ttft_s = time.perf_counter() - call.t0

    def pin_tool_call_ids(self, response: Mapping[str, Any]) -> None:
        """Give the answer's tool calls the ids the client was streamed (the derenders draw their own)."""
        for choice, streamed in zip(response.get("choices") or (), self.choices, strict=False):
            calls = (choice.get("message") or {}).get("tool_calls") or []
            ids = (streamed.state or {}).get("last_tool_call_ids") or []
            if len(ids) == len(calls):
                for call, call_id in zip(calls, ids, strict=True):
                    call["id"] = call_id

    async def finish(self, response: Mapping[str, Any]) -> None:
        """Each choice's finish reason as the answer has it, the usage when asked for, and the end."""
        for choice in response.get("choices") or ():
            end = {
                "index": choice.get("index", 0),
                "delta": {},
                "logprobs": None,
                "finish_reason": choice.get("finish_reason"),
                "stop_reason": choice.get("stop_reason"),
            }
            await self._send(response, [end])
        if self.include_usage:
            await self._send(response, [], usage=response.get("usage"))
        await self.call.send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await self.call.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def fail(self, failed: StreamFailed) -> None:
        """End the client's stream with the error (the OpenAI SDKs raise on it)."""
        await self.call.send({"type": "http.response.body", "body": failed.event, "more_body": True})
        await self.call.send({"type": "http.response.body", "body": b"", "more_body": False})


def stream_failure(exc: EngineRejected | RetryableBackendError | ProxyError) -> StreamFailed:
    """The failure that ends a stream already begun: its error event in the chat stream's shape (the
    Responses and Messages translations turn it into theirs)."""
    if isinstance(exc, EngineRejected):
        return StreamFailed("backend_rejected", exc.message, exc.status, b"data: " + exc.data + b"\n\n")
    error = exc.error if isinstance(exc, RetryableBackendError) else exc
    return StreamFailed(error.code, error.message, error.status_code, error.sse_event())


def _chunk(response: Mapping[str, Any], choices: list[dict[str, Any]], **extra: Any) -> bytes:
    chunk = {
        "id": response.get("id"),
        "object": "chat.completion.chunk",
        "created": response.get("created"),
        "model": response.get("model"),
        "choices": choices,
        **extra,
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _deltas(choice: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    message = choice.get("message") or {}
    index = choice.get("index", 0)
    yield {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    delta: dict[str, Any] = {}
    if message.get("reasoning"):
        delta["reasoning"] = message["reasoning"]
    if message.get("content"):
        delta["content"] = message["content"]
    if delta or choice.get("token_ids"):
        yield {
            "index": index,
            "delta": delta,
            "logprobs": choice.get("logprobs"),
            "finish_reason": None,
            "token_ids": choice.get("token_ids"),
        }
    calls = [
        {"index": i, "id": call.get("id"), "type": "function", "function": call.get("function")}
        for i, call in enumerate(message.get("tool_calls") or ())
    ]
    if calls:
        yield {"index": index, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}
    yield {
        "index": index,
        "delta": {},
        "logprobs": None,
        "finish_reason": choice.get("finish_reason"),
        "stop_reason": choice.get("stop_reason"),
    }


def sse_chunks(response: Mapping[str, Any], include_usage: bool) -> Iterator[bytes]:
    """The stream of `response` (a chat completion), `data: [DONE]` last."""
    first = True
    for choice in response.get("choices") or ():
        for delta in _deltas(choice):
            if first:
                yield _chunk(response, [delta], prompt_token_ids=response.get("prompt_token_ids"))
                first = False
            else:
                yield _chunk(response, [delta])
    if include_usage:
        yield _chunk(response, [], usage=response.get("usage"))
    yield b"data: [DONE]\n\n"
