"""Fixtures shared by the whole suite: the tiny vLLM servers (one of each per session, started on a thread as soon
as collection shows a test will ask for it) and their tokenizers.

A test that talks to vLLM asks for ``vllm_server`` and is marked ``@pytest.mark.vllm``::

    @pytest.mark.vllm
    def test_chat(vllm_server):
        httpx.post(f"{vllm_server.base_url}/chat/completions", json={"model": vllm_server.model, ...})
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from examples.tiny_vllm.end_turn import TOKEN_ENV
from examples.tiny_vllm.tiny_model import DEFAULT_DIR
from examples.tiny_vllm.vllm_server import VLLMServer, build_tiny_model, external_vllm_server, running_vllm_server
from tests.support.early_servers import early_servers, tmp_path_factory_of

# Set to the base URL of a tiny vLLM you started yourself (python -m examples.tiny_vllm.vllm_server) to skip the
# minute of start-up on every run while iterating.
EXTERNAL_VLLM_ENV = "AGL_TEST_VLLM_BASE_URL"


def pytest_configure(config: pytest.Config) -> None:
    """Environment every test process needs, before any test module imports litellm or transformers."""
    # LiteLLM fetches its model cost map from the internet at import time unless told not to.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # The session vLLMs start ahead (tests/support/early_servers.py), those the first tests need first; one named
    # in EXTERNAL_VLLM_ENV / EXTERNAL_REAL_VLLM_ENV is not started.
    servers = early_servers(config)
    if not os.environ.get(EXTERNAL_REAL_VLLM_ENV):
        servers.register("real_vllm_server", partial(_serve_real_vllm, config))
    if not os.environ.get(EXTERNAL_VLLM_ENV):
        # After the real-vocabulary one: the first tests that need a vLLM need that one.
        servers.register("vllm_server", partial(_serve_tiny_vllm, config), after=("real_vllm_server",))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the vLLM server, so ``-m "not vllm"`` deselects it even if the mark was forgotten."""
    for item in items:
        if {"vllm_server", "real_vllm_server"}.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """Directory of the tiny Qwen2 model (built on first use, cached under .cache/tiny-qwen2)."""
    return build_tiny_model(DEFAULT_DIR)


@pytest.fixture(scope="session")
def vllm_server(request: pytest.FixtureRequest) -> Iterator[VLLMServer]:
    """One vLLM OpenAI server on the tiny model for the whole session, stopped at the end.

    Started with --enable-scale-out, so the proxy serves its chat calls token in, token out (the token chain).
    """
    external = os.environ.get(EXTERNAL_VLLM_ENV)
    if external:
        _announce(request.config, f"[vllm] using the tiny vLLM at {external} ({EXTERNAL_VLLM_ENV})")
        yield external_vllm_server(external, build_tiny_model(DEFAULT_DIR))
        return
    server: VLLMServer = early_servers(request.config).get("vllm_server")
    _announce(request.config, f"[vllm] tiny vLLM serving {server.model} at {server.base_url} (log: {server.log_path})")
    yield server


# Both session vLLMs slow down the requests that ask (`examples.tiny_vllm.pace.paced`): the tests that act while a
# generation runs (a client that leaves, a weight update) need one that outlasts their own requests on a loaded machine.
PACED_ARGS = ("--logits-processors", "examples.tiny_vllm.pace:Paced")
ROOT = Path(__file__).resolve().parents[1]
REPO_ON_PATH = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
"""vLLM imports the processors from this repository."""


def _serve_tiny_vllm(config: pytest.Config) -> AbstractContextManager[VLLMServer]:
    log_path = tmp_path_factory_of(config).mktemp("vllm") / "vllm.log"
    return running_vllm_server(
        build_tiny_model(DEFAULT_DIR),
        log_path=log_path,
        extra_args=("--enable-scale-out", *PACED_ARGS),
        extra_env=REPO_ON_PATH,
    )


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path: Path) -> Any:
    """The tiny model's tokenizer (a transformers fast tokenizer with the Qwen2.5-style chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def _announce(config: pytest.Config, line: str) -> None:
    """Print one line past pytest's output capture, so a slow start-up is explained."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    if capture is None:
        reporter.write_line(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write("\n")  # -q progress dots do not end their line
        reporter.write_line(line)


# The real-vocabulary model (examples/tiny_vllm/real_vocab.py): Qwen2.5's 151,643 BPE ranks and chat template, for
# tests where re-tokenization matters. Its vLLM takes prompts as token ids too (--enable-scale-out), parses hermes
# tool calls (VLLM_FLAGS), and ends the turn of a request that asks (`examples.tiny_vllm.end_turn.end_turn_after`):
# one server for the tests of free sampling and those of turns that end as a trained model's.
EXTERNAL_REAL_VLLM_ENV = "AGL_TEST_REAL_VLLM_BASE_URL"  # like EXTERNAL_VLLM_ENV, for `real_vllm_server`
REAL_VLLM_ARGS = (
    "--enable-scale-out",
    "--logits-processors",
    "examples.tiny_vllm.end_turn:EndTurnAfter",
    "examples.tiny_vllm.pace:Paced",
)


@pytest.fixture(scope="session")
def real_vocab_model_path() -> Path:
    """Directory of the real-vocabulary tiny model (built on first use, cached under .cache/tiny-qwen2-real)."""
    from examples.tiny_vllm.vllm_server import build_real_vocab_model

    return build_real_vocab_model()


@pytest.fixture(scope="session")
def real_vllm_server(request: pytest.FixtureRequest, real_vocab_model_path: Path) -> Iterator[VLLMServer]:
    """One vLLM on the real-vocabulary model for the whole session (hermes tool calls, token-in endpoints, turns
    that end on request)."""
    from examples.tiny_vllm.real_vocab import QWEN2_5

    served = QWEN2_5.served_model_name
    external = os.environ.get(EXTERNAL_REAL_VLLM_ENV)
    if external:
        _announce(request.config, f"[vllm] using the real-vocabulary vLLM at {external} ({EXTERNAL_REAL_VLLM_ENV})")
        yield external_vllm_server(external, real_vocab_model_path, served)
        return
    server: VLLMServer = early_servers(request.config).get("real_vllm_server")
    _announce(request.config, f"[vllm] real-vocabulary vLLM: {served} at {server.base_url} (log: {server.log_path})")
    yield server


@contextmanager
def _serve_real_vllm(config: pytest.Config) -> Iterator[VLLMServer]:
    from transformers import AutoTokenizer

    from examples.tiny_vllm.real_vocab import QWEN2_5
    from examples.tiny_vllm.vllm_server import build_real_vocab_model

    model_path = build_real_vocab_model()
    end_of_turn = AutoTokenizer.from_pretrained(model_path).convert_tokens_to_ids("<|im_end|>")
    env = {TOKEN_ENV: str(end_of_turn), **REPO_ON_PATH}
    log_path = tmp_path_factory_of(config).mktemp("real-vllm") / "vllm.log"
    with running_vllm_server(
        model_path,
        log_path=log_path,
        served_model_name=QWEN2_5.served_model_name,
        extra_args=REAL_VLLM_ARGS,
        extra_env=env,
    ) as server:
        yield server


def pytest_sessionstart(session: pytest.Session) -> None:
    """A run of the whole suite (no paths, -k or -m given) starts the session vLLMs while it collects."""
    option = session.config.option
    whole = session.config.args_source == pytest.Config.ArgsSource.TESTPATHS and not (option.keyword or option.markexpr)
    if whole and not option.collectonly:
        early_servers(session.config).start()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the session's servers that collected tests will ask for (tests/support/early_servers.py), unless
    only collecting; stop those started ahead that no test wants."""
    if session.config.option.collectonly:
        early_servers(session.config).stop_all()
    else:
        early_servers(session.config).collected(session.items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Once a test's teardown is done, stop the session servers no later test uses."""
    try:
        return (yield)
    finally:
        early_servers(item.config).finished(item.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    early_servers(session.config).stop_all()


@pytest.fixture(scope="session")
def real_tokenizer(real_vocab_model_path: Path) -> Any:
    """The real-vocabulary model's tokenizer: Qwen2.5's ids, special tokens and chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_vocab_model_path)
