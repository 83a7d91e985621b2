"""Generations that survive a weight update.

The token chain samples through vLLM's streamed `/inference/v1/generate`, so the ids of a
generation are in hand as they come. When a pause asks the calls in flight to stop generating
(`CallHandle.stop`, a weight update), the stream is closed (vLLM's generate endpoint aborts a
request whose client disconnects), the call parks until the resume, and then generates on from
its prompt and the ids it kept, token in, on the weights served then: with what is left of its
token limit and the same sampling. The client sees one answer that took longer.

Each choice records its segments, `(version, n_ids)` in sampling order: which weight version
(the deployment's `agl_model_version` when the segment began) sampled how many of its ids; the
log-probs come from the weights that sampled each id.

A continuation is the uninterrupted generation only where sampling does not look back at the
output: greedy or seeded sampling continues as it would have at unchanged weights, but vLLM
counts presence and frequency penalties, `min_tokens`, logits processors' state and stop strings
over a request's own output, which starts again at the continuation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from ..backends.base import RetryableBackendError
from ..backends.forwarding import CONNECT_TIMEOUT_S, backend_failures
from ..common.deployments import Deployment
from ..common.errors import BackendFailedError, short_text
from ..controls.pausing import CallHandle
from .engine import GENERATE, engine_answer, server_root

Segments = list[tuple[str | None, int]]
"""`[(version, n_ids), ...]`: a choice's ids by the weight version that sampled them."""


@dataclass(slots=True)
class Sampled:
    """One choice's generation so far."""

    index: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[Any] | None = None
    """The stream chunks' logprobs entries; None when they carry none."""
    finish_reason: str | None = None
    segments: Segments = field(default_factory=list)

    def take(self, part: Mapping[str, Any], version: str | None) -> None:
        """Add a stream chunk's part for this choice, sampled by `version`."""
        ids = part.get("token_ids") or ()
        if ids:
            self.ids += ids
            if self.segments and self.segments[-1][0] == version:
                self.segments[-1] = (version, self.segments[-1][1] + len(ids))
            else:
                self.segments.append((version, len(ids)))
        logprobs = part.get("logprobs")
        if logprobs is not None:
            self.logprobs = [*(self.logprobs or ()), *(logprobs.get("content") or ())]
        if part.get("finish_reason") is not None:
            self.finish_reason = part["finish_reason"]

    def answer(self) -> dict[str, Any]:
        """This choice as `/inference/v1/generate` answers a call that is not streamed."""
        return {
            "index": self.index,
            "token_ids": self.ids,
            "logprobs": None if self.logprobs is None else {"content": self.logprobs},
            "finish_reason": self.finish_reason,
        }


def continued_body(
    generate_body: Mapping[str, Any], kept: list[int], prompt_ids: list[int], turn: int
) -> dict[str, Any]:
    """The generate request that goes on from `kept` (ids sampled by `generate_body`): the prompt
    and those ids in, the token limits less what was kept, a request id of its own."""
    sampling = dict(generate_body["sampling_params"])
    for name in ("max_tokens", "min_tokens"):
        limit = sampling.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool):
            sampling[name] = max(1 if name == "max_tokens" else 0, limit - len(kept))
    request_id = generate_body.get("request_id")
    return {
        **generate_body,
        "token_ids": [*prompt_ids, *kept],
        "sampling_params": sampling,
        "request_id": None if request_id is None else f"{request_id}-continued-{turn}",
    }


@dataclass(frozen=True, slots=True)
class Sampler:
    """Where a call's generations run, and what may stop them."""

    client: httpx.AsyncClient
    deployment: Deployment
    headers: Mapping[str, str]
    handle: CallHandle | None
    """The call's place at the pause gate (None: nothing stops its generations)."""
    version: Callable[[], str | None]
    """The version the deployment serves now (asked again after each resume)."""


class Generation:
    """One choice generated through the streamed generate endpoint (`n` = 1: vLLM 0.31's streamed
    generate fails for more), continued across the weight updates that stop it."""

    __slots__ = ("body", "choice", "request_id", "sampler", "wake")

    def __init__(self, sampler: Sampler, generate_body: Mapping[str, Any], index: int = 0) -> None:
        self.sampler = sampler
        self.body = generate_body
        self.choice = Sampled(index)
        self.request_id: str | None = generate_body.get("request_id")
        self.wake = asyncio.Event()
        """Set whenever ids or the finish arrive (a stream relays them)."""

    async def run(self) -> Sampled:
        """Generate until the engine finishes the choice. Raises as `post_json` does."""
        prompt_ids = list(self.body["token_ids"])
        body: Mapping[str, Any] = self.body
        turn = 0
        try:
            while True:
                handle = self.sampler.handle
                if handle is not None and handle.stop.is_set():
                    await handle.park()
                if turn:
                    body = continued_body(self.body, self.choice.ids, prompt_ids, turn)
                    if handle is not None:
                        handle.continued(len(self.choice.ids))
                if not await self._stream(body):
                    return self.choice
                limit = self.body["sampling_params"].get("max_tokens")
                if isinstance(limit, int) and len(self.choice.ids) >= limit:
                    # Stopped between its last id and the finish that comes with it.
                    self.choice.finish_reason = "length"
                    return self.choice
                turn += 1
        finally:
            self.wake.set()

    async def _stream(self, body: Mapping[str, Any]) -> bool:
        """One streamed generate; True when a pause stopped it before the engine finished."""
        sampler = self.sampler
        deployment = sampler.deployment
        timeout = httpx.Timeout(deployment.timeout_s, connect=min(CONNECT_TIMEOUT_S, deployment.timeout_s))
        request = sampler.client.build_request(
            "POST",
            server_root(deployment.api_base or "") + GENERATE,
            content=orjson.dumps({**body, "stream": True}),
            headers=sampler.headers,
            timeout=timeout,
        )
        version = sampler.version()
        with backend_failures(deployment, "did not answer", "failed"):
            response = await sampler.client.send(request, stream=True)
        try:
            if response.status_code >= 300:
                with backend_failures(deployment, "did not answer", "failed"):
                    data = await response.aread()
                engine_answer(deployment, GENERATE, response.status_code, response.headers, data)
            reader = asyncio.ensure_future(self._read(response, version))
            try:
                if sampler.handle is None:
                    await reader
                    return False
                stop = asyncio.ensure_future(sampler.handle.stop.wait())
                try:
                    await asyncio.wait((reader, stop), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                if reader.done():
                    reader.result()
                    return False
                # The pause came first: what was read is kept, the rest of the stream is not waited for.
                return self.choice.finish_reason is None
            finally:
                # Also when the call is cancelled (its client left): the read stops before the stream closes.
                if not reader.done():
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
        finally:
            await response.aclose()

    async def _read(self, response: httpx.Response, version: str | None) -> None:
        with backend_failures(self.sampler.deployment, "stalled mid-stream", "dropped the stream"):
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
                        BackendFailedError(f"backend {self.sampler.deployment.label} streamed data that is not JSON")
                    ) from exc
                self._take(chunk, version)
                self.wake.set()
        # The engine leaves out a finish that comes without ids.
        self.choice.finish_reason = self.choice.finish_reason or "stop"

    def _take(self, chunk: Mapping[str, Any], version: str | None) -> None:
        error = chunk.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, Mapping) else error
            raise RetryableBackendError(
                BackendFailedError(
                    f"backend {self.sampler.deployment.label} reported an error mid-stream: {short_text(str(message))}"
                )
            )
        if self.request_id is None:
            self.request_id = chunk.get("request_id")
        for part in chunk.get("choices") or ():
            self.choice.take(part, version)


async def generate_continuing(
    sampler: Sampler, generate_body: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[int, Segments]]:
    """The generated answer (`/inference/v1/generate`'s shape for a call that is not streamed) and
    each choice's segments, every choice generated as its own continuable stream."""
    n = generate_body["sampling_params"].get("n") or 1
    request_id = generate_body.get("request_id")
    bodies = [generate_body]
    if n > 1:
        one = {**generate_body["sampling_params"], "n": 1}
        bodies = [
            {**generate_body, "sampling_params": one, "request_id": None if request_id is None else f"{request_id}-{i}"}
            for i in range(n)
        ]
    generations = [Generation(sampler, body, i) for i, body in enumerate(bodies)]
    choices = await asyncio.gather(*(g.run() for g in generations))
    generated = {"request_id": request_id, "choices": [c.answer() for c in choices]}
    return generated, {c.index: c.segments for c in choices}
