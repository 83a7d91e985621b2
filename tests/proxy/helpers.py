"""Test helpers: serving ASGI apps on real ports, and a store that can be made to fail."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import uvicorn

from agl_store.base import LightningStore
from agl_store.errors import StoreUnavailableError
from agl_store.models import Span
from agl_store.web.serving import bind_socket, start_uvicorn


@contextlib.asynccontextmanager
async def serve(app: Any, port: int = 0) -> AsyncIterator[str]:
    """Serve `app` with uvicorn on 127.0.0.1, the way the proxy serves itself; yields `http://127.0.0.1:PORT`."""
    sock = bind_socket("127.0.0.1", port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = await start_uvicorn(server, sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


class FlakyStore(LightningStore):
    """Wraps a real store; while `down` is set, span calls fail like an unreachable server,
    and while `writable` is clear, span writes hang like a stalled one."""

    def __init__(self, inner: LightningStore) -> None:
        self.inner = inner
        self.down = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.calls: list[str] = []

    def _check(self, name: str) -> None:
        self.calls.append(name)
        if self.down:
            raise StoreUnavailableError("store unreachable (injected)")

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        self._check("add_many_spans")
        await self.writable.wait()
        return await self.inner.add_many_spans(spans)

    async def add_span(self, span: Span) -> Span | None:
        self._check("add_span")
        await self.writable.wait()
        return await self.inner.add_span(span)

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        self._check("get_next_span_sequence_id")
        return await self.inner.get_next_span_sequence_id(rollout_id, attempt_id)

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[tuple[str, str]]) -> Sequence[int]:
        self._check("get_many_span_sequence_ids")
        return await self.inner.get_many_span_sequence_ids(rollout_attempt_ids)

    async def get_latest_attempt(self, rollout_id: str) -> Any:
        self._check("get_latest_attempt")
        return await self.inner.get_latest_attempt(rollout_id)

    async def get_rollout_by_id(self, rollout_id: str) -> Any:
        self._check("get_rollout_by_id")
        return await self.inner.get_rollout_by_id(rollout_id)

    async def query_spans(self, rollout_id: str, attempt_id: Any = None, **kwargs: Any) -> Sequence[Span]:
        return await self.inner.query_spans(rollout_id, attempt_id, **kwargs)

    async def close(self) -> None:
        await self.inner.close()


def model_entry(
    name: str, api_base: str, provider: str = "hosted_vllm", backend_model: str = "tiny", **info: Any
) -> dict[str, Any]:
    """One LiteLLM `model_list` entry."""
    entry: dict[str, Any] = {
        "model_name": name,
        "litellm_params": {"model": f"{provider}/{backend_model}", "api_base": api_base},
    }
    if info:
        entry["model_info"] = info
    return entry


async def wait_for_spans(store: LightningStore, rollout_id: str, count: int, timeout_s: float = 10.0) -> Sequence[Span]:
    """The rollout's spans once there are at least `count` of them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        spans = await store.query_spans(rollout_id)
        if len(spans) >= count or loop.time() > deadline:
            return spans
        await asyncio.sleep(0.02)


def pairs(spans: Sequence[Span]) -> list[tuple[int | None, str]]:
    return [(s.sequence_id, s.attributes.get("agl.backend")) for s in spans]


def metric(text: str, name: str) -> float:
    """The value of an unlabelled line of `/metrics`."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


async def vllm_metric(http: Any, server: Any, name: str) -> float:
    """vLLM's metric `name` (`GET /metrics` of `server`, a VLLMServer), summed over its labels."""
    metrics = (await http.get(server.base_url.removesuffix("/v1") + "/metrics")).text
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name + "{"))
