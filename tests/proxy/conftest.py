"""Fixtures of the proxy tests: a fake vLLM-shaped backend on a real port, a store, a proxy."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from agl_proxy.server.proxy import LLMProxy
from agl_store.sqlite import SQLiteStore

from .fake_backend import FakeBackend
from .helpers import FlakyStore, model_entry, serve

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[FlakyStore]:
    """A real SQLite store behind a switch that can take it 'down'."""
    inner = await SQLiteStore(tmp_path / "agl.db").open()
    flaky = FlakyStore(inner)
    yield flaky
    await flaky.close()


@pytest.fixture
def new_rollout(store: FlakyStore) -> Callable[[], Awaitable[tuple[str, str]]]:
    """Starts a rollout in the store; returns (rollout_id, attempt_id)."""

    async def make() -> tuple[str, str]:
        rollout = await store.inner.start_rollout(input={"task": "test"})
        return rollout.rollout_id, rollout.attempt.attempt_id

    return make


@pytest.fixture
async def backend() -> AsyncIterator[tuple[FakeBackend, str]]:
    """A fake vLLM-shaped backend: (its state, its OpenAI base URL)."""
    fake = FakeBackend(name="a")
    async with serve(fake.app()) as url:
        yield fake, url + "/v1"
        fake.release.set()  # let hung calls end, or the server waits for them forever


@pytest.fixture
async def proxy_factory(store: FlakyStore) -> AsyncIterator[Callable[..., Any]]:
    """Starts proxies on free ports; stops them at the end of the test."""
    started = []

    async def make(model_list: Any, **kwargs: Any) -> LLMProxy:
        kwargs.setdefault("store", store)
        proxy = LLMProxy(model_list=model_list, port=0, **kwargs)
        await proxy.start()
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        await proxy.stop()


@pytest.fixture
async def proxy(proxy_factory: Callable[..., Any], backend: tuple[FakeBackend, str]) -> LLMProxy:
    return await proxy_factory([model_entry("tiny", backend[1])])


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.fixture
async def chain_proxy(proxy_factory: Callable[..., Any], vllm_server: Any) -> LLMProxy:
    """A proxy with logprobs in front of the tiny vLLM, whose chat calls go through the token chain."""
    proxy: LLMProxy = await proxy_factory(
        [model_entry(vllm_server.model, vllm_server.base_url, backend_model=vllm_server.model)], logprobs=True
    )
    return proxy
