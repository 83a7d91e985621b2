"""A real gateway for the runner tests: SQLite store, agl's proxy in front of the tiny vLLM with
the store's routes on the same port, and the proxy published as the rollouts' LLM resource."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from examples.tiny_vllm.vllm_server import VLLMServer, running_vllm_server

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
    from agl_proxy.server.proxy import LLMProxy
    from agl_store.server import create_app as create_store_app
    from agl_store.sqlite import SQLiteStore

    store = await SQLiteStore(str(tmp_path / "agl.db")).open()
    entry = {
        "model_name": "tiny",
        "litellm_params": {"model": f"hosted_vllm/{vllm_server.model}", "api_base": vllm_server.base_url},
    }
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


@pytest.fixture(scope="session")
def dev_vllm_server(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A tiny vLLM of its own for the training tests (one per session): training changes the
    weights it serves, so it runs on a copy of the tiny model, in dev mode
    (`VLLM_SERVER_DEV_MODE=1`) for the in-place weight reload."""
    root = tmp_path_factory.mktemp("dev-vllm")
    model = root / "model"
    shutil.copytree(tiny_model_path, model)
    with running_vllm_server(model, log_path=root / "vllm.log", extra_env={"VLLM_SERVER_DEV_MODE": "1"}) as server:
        yield server
