"""A real gateway for the runner tests: SQLite store, agl's proxy in front of the tiny vLLM with
the store's routes on the same port, and the proxy published as the rollouts' LLM resource."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from examples.tiny_vllm.tiny_model import DEFAULT_DIR
from examples.tiny_vllm.vllm_server import VLLMServer, build_tiny_model, running_vllm_server
from tests.support.early_servers import early_servers, tmp_path_factory_of

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


def pytest_configure(config: pytest.Config) -> None:
    # The training tests' vLLMs start ahead too (tests/support/early_servers.py), once the suite's two are up:
    # the proxy tests, which come first, need those.
    servers = early_servers(config)
    first = ("real_vllm_server", "vllm_server")
    servers.register("dev_vllm_server", partial(_serve_dev_vllm, config), after=first)
    servers.register("real_dev_vllm", partial(_serve_real_dev_vllm, config), after=first)


@pytest.fixture(scope="session")
def dev_vllm_server(request: pytest.FixtureRequest) -> VLLMServer:
    """A tiny vLLM of its own for the training tests (one per session): training changes the
    weights it serves, so it runs on a copy of the tiny model, in dev mode
    (`VLLM_SERVER_DEV_MODE=1`) for the in-place weight reload."""
    server: VLLMServer = early_servers(request.config).get("dev_vllm_server")
    return server


@contextmanager
def _serve_dev_vllm(config: pytest.Config) -> Iterator[VLLMServer]:
    root = tmp_path_factory_of(config).mktemp("dev-vllm")
    model = root / "model"
    shutil.copytree(build_tiny_model(DEFAULT_DIR), model)
    with running_vllm_server(model, log_path=root / "vllm.log", extra_env={"VLLM_SERVER_DEV_MODE": "1"}) as server:
        yield server


@dataclass(frozen=True)
class Served:
    """The multi-turn example's vLLM: a copy of the real-vocabulary model, dev mode, token-in endpoints."""

    model_path: Path
    address: str


@pytest.fixture(scope="session")
def real_dev_vllm(request: pytest.FixtureRequest) -> Served:
    """The word-lookup example's vLLM (`examples.word_lookup.train.fresh_run`), for the training tests of the
    multi-turn agent (one per session, training changes its weights)."""
    served: Served = early_servers(request.config).get("real_dev_vllm")
    return served


@contextmanager
def _serve_real_dev_vllm(config: pytest.Config) -> Iterator[Served]:
    from examples.word_lookup.train import fresh_run

    with fresh_run(tmp_path_factory_of(config).mktemp("real-dev-vllm")) as (model_path, address):
        yield Served(model_path, address)
