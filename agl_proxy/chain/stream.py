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
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from ..backends.base import Call, RetryableBackendError
from ..backends.forwarding import CONNECT_TIMEOUT_S, backend_failures
from ..common.deployments import Deployment
from ..common.errors import BackendFailedError, ProxyError, short_text
from .engine import DERENDER, GENERATE, EngineRejected, ends_on_stop_token, engine_answer, post_json, server_root
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
    """One choice as its ids arrive and its deltas go out."""

    index: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[Any] | None = None
    """The generate chunks' logprobs entries, for the whole answer's derender; None when they carry none."""
    finish_reason: str | None = None
    sent: int = 0
    """How many of `ids` the streamed derender has had."""
    finished: bool = False
    """The streamed derender has had the finish."""
    state: Any = None

    def pending(self) -> bool:
        return len(self.ids) > self.sent or (self.finish_reason is not None and not self.finished)


class ChainStream:
    """The client's side of one streamed chat call: `relay` streams the answer as it is
    generated and returns it as `/inference/v1/generate` answers a call that is not streamed;
    `finish` ends the client's stream with the whole answer's finish reasons and usage."""

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
        "transport",
    )

    def __init__(
        self,
        call: Call,
        transport: EngineHttp,
        deployment: Deployment,
        headers: Mapping[str, str],
        prompt_ids: list[int],
    ) -> None:
        self.call = call
        self.transport = transport
        self.deployment = deployment
        self.headers = headers
        self.include_usage = bool((call.body.get("stream_options") or {}).get("include_usage"))
        # One choice: vLLM 0.31's streamed generate fails for n > 1; each choice would have its own state.
        self.choices = [_Choice(0)]
        self._prompt_ids = prompt_ids
        self._first = True
        self.request: dict[str, Any] = {}
        self.sampling: Mapping[str, Any] = {}

    @property
    def started(self) -> bool:
        return not self._first

    async def relay(
        self, client: httpx.AsyncClient, generate_body: Mapping[str, Any], chat_request: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Stream the generation to the client, its deltas parsed as the engine parses
        `chat_request`'s answer; the generated answer (`GenerateResponse`'s shape).

        Failures before the client's answer began raise as `post_json` does; after it,
        `StreamFailed`."""
        deployment = self.deployment
        self.sampling = generate_body["sampling_params"]
        # What every streamed derender repeats, serialized once.
        self.request = {
            "stream": True,
            "model": deployment.model,
            "prompt_tokens": len(self._prompt_ids),
            # Its parsers need the prompt to see whether it left reasoning open.
            "prompt_token_ids": orjson.Fragment(orjson.dumps(self._prompt_ids)),
            "chat_request": orjson.Fragment(orjson.dumps(chat_request)),
        }
        timeout = httpx.Timeout(deployment.timeout_s, connect=min(CONNECT_TIMEOUT_S, deployment.timeout_s))
        request = client.build_request(
            "POST",
            server_root(deployment.api_base or "") + GENERATE,
            content=orjson.dumps({**generate_body, "stream": True}),
            headers=self.headers,
            timeout=timeout,
        )
        with backend_failures(deployment, "did not answer", "failed"):
            response = await client.send(request, stream=True)
        try:
            if response.status_code >= 300:
                with backend_failures(deployment, "did not answer", "failed"):
                    data = await response.aread()
                engine_answer(deployment, GENERATE, response.status_code, response.headers, data)
            request_id = await self._relay(response, generate_body.get("request_id"))
        except (EngineRejected, RetryableBackendError, ProxyError) as exc:
            if not self.started:
                raise
            raise stream_failure(exc) from exc
        finally:
            await response.aclose()
        return {
            "request_id": request_id,
            "choices": [
                {
                    "index": c.index,
                    "token_ids": c.ids,
                    "logprobs": None if c.logprobs is None else {"content": c.logprobs},
                    "finish_reason": c.finish_reason,
                }
                for c in self.choices
            ],
        }

    async def _relay(self, response: httpx.Response, request_id_sent: str | None) -> str | None:
        wake = asyncio.Event()
        request_id = [request_id_sent]
        reader = asyncio.ensure_future(self._read(response, wake, request_id))
        try:
            while True:
                ready = [c for c in self.choices if c.pending()]
                if ready:
                    # The ids that came while the last derenders ran go out in one.
                    answers = await asyncio.gather(*(self._derender(c, request_id[0]) for c in ready))
                    for choice, (chunk, ids) in zip(ready, answers, strict=True):
                        await self._send_delta(choice, chunk, ids)
                    continue
                if reader.done():
                    reader.result()
                    return request_id[0]
                await wake.wait()
                wake.clear()
        finally:
            if not reader.done():
                reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, response: httpx.Response, wake: asyncio.Event, request_id: list[str | None]) -> None:
        try:
            with backend_failures(self.deployment, "stalled mid-stream", "dropped the stream"):
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    payload = line[len("data: ") :]
                    if payload == "[DONE]":
                        break
                    try:
                        chunk = orjson.loads(payload)
                    except orjson.JSONDecodeError as exc:
                        raise RetryableBackendError(
                            BackendFailedError(f"backend {self.deployment.label} streamed data that is not JSON")
                        ) from exc
                    self._take(chunk, request_id)
                    wake.set()
            # The engine leaves out a finish that comes without ids.
            for choice in self.choices:
                choice.finish_reason = choice.finish_reason or "stop"
        finally:
            wake.set()

    def _take(self, chunk: Mapping[str, Any], request_id: list[str | None]) -> None:
        error = chunk.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, Mapping) else error
            raise RetryableBackendError(
                BackendFailedError(
                    f"backend {self.deployment.label} reported an error mid-stream: {short_text(str(message))}"
                )
            )
        request_id[0] = chunk.get("request_id", request_id[0])
        for part in chunk.get("choices") or ():
            choice = self.choices[part["index"]]
            choice.ids += part.get("token_ids") or ()
            logprobs = part.get("logprobs")
            if logprobs is not None:
                choice.logprobs = [*(choice.logprobs or ()), *(logprobs.get("content") or ())]
            if part.get("finish_reason") is not None:
                choice.finish_reason = part["finish_reason"]

    async def _derender(self, choice: _Choice, request_id: str | None) -> tuple[dict[str, Any], list[int]]:
        ids = choice.ids[choice.sent :]
        finish = choice.finish_reason
        # The stop id comes with the finish; its text is not the answer's (`ends_on_stop_token`),
        # so the parser is not given it, and the client still gets the id.
        shown = ids[:-1] if ends_on_stop_token(choice.ids, finish, self.sampling) else ids
        part = {"index": choice.index, "token_ids": shown, "finish_reason": finish}
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
            out = {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": None, "token_ids": ids}
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
