"""A real gateway for the runner tests: SQLite store, agl's proxy in front of the tiny vLLM with
the store's routes on the same port, and the proxy published as the rollouts' LLM resource."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

import pytest

REPO_ROOT = Path(__file__).parents[2]


@dataclass
class Stack:
    store: object
    proxy: object
    resources_id: str

    @property
    def store_url(self) -> str:
        return self.proxy.url  # type: ignore[attr-defined]


@pytest.fixture
async def stack(vllm_server, tmp_path: Path) -> AsyncIterator[Stack]:
    from agl_proxy.proxy import LLMProxy
    from agl_store.server import create_app as create_store_app
    from agl_store.sqlite import SQLiteStore

    store = await SQLiteStore(str(tmp_path / "agl.db")).open()
    entry = {"model_name": "tiny", "litellm_params": {"model": f"hosted_vllm/{vllm_server.model}", "api_base": vllm_server.base_url}}
    proxy = LLMProxy(
        model_list=[entry], store=store, port=0, logprobs=True, store_app=create_store_app(store, manage_store=False)
    )
    await proxy.start()
    update = await store.add_resources({"main_llm": proxy.as_resource()})
    try:
        yield Stack(store=store, proxy=proxy, resources_id=update.resources_id)
    finally:
        await proxy.stop()
        await store.close()
