"""Fixtures shared by the whole suite: the tiny vLLM server (one per session, started lazily) and its tokenizer.

A test that talks to vLLM asks for ``vllm_server`` and is marked ``@pytest.mark.vllm``::

    @pytest.mark.vllm
    def test_chat(vllm_server):
        httpx.post(f"{vllm_server.base_url}/chat/completions", json={"model": vllm_server.model, ...})
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.tiny_vllm.end_turn import TOKEN_ENV
from examples.tiny_vllm.tiny_model import DEFAULT_DIR
from examples.tiny_vllm.vllm_server import VLLMServer, build_tiny_model, external_vllm_server, running_vllm_server

# Set to the base URL of a tiny vLLM you started yourself (python -m examples.tiny_vllm.vllm_server) to skip the
# minute of start-up on every run while iterating.
EXTERNAL_VLLM_ENV = "AGL_TEST_VLLM_BASE_URL"


def pytest_configure(config: pytest.Config) -> None:
    """Environment every test process needs, before any test module imports litellm or transformers."""
    # LiteLLM fetches its model cost map from the internet at import time unless told not to.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
def vllm_server(
    request: pytest.FixtureRequest, tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    """One vLLM OpenAI server on the tiny model for the whole session, stopped at the end.

    Started with --enable-scale-out, so the proxy serves its chat calls token in, token out (the token chain).
    """
    external = os.environ.get(EXTERNAL_VLLM_ENV)
    if external:
        _announce(request.config, f"[vllm] using the tiny vLLM at {external} ({EXTERNAL_VLLM_ENV})")
        yield external_vllm_server(external, tiny_model_path)
        return
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with running_vllm_server(tiny_model_path, log_path=log_path, extra_args=("--enable-scale-out",)) as server:
        _announce(request.config, f"[vllm] tiny vLLM serving {server.model} at {server.base_url} (log: {log_path})")
        yield server


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
REAL_VLLM_ARGS = ("--enable-scale-out", "--logits-processors", "examples.tiny_vllm.end_turn:EndTurnAfter")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def real_vocab_model_path() -> Path:
    """Directory of the real-vocabulary tiny model (built on first use, cached under .cache/tiny-qwen2-real)."""
    from examples.tiny_vllm.vllm_server import build_real_vocab_model

    return build_real_vocab_model()


@pytest.fixture(scope="session")
def real_vllm_server(
    request: pytest.FixtureRequest,
    real_vocab_model_path: Path,
    real_tokenizer: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VLLMServer]:
    """One vLLM on the real-vocabulary model for the whole session (hermes tool calls, token-in endpoints, turns
    that end on request)."""
    from examples.tiny_vllm.real_vocab import QWEN2_5

    served = QWEN2_5.served_model_name
    external = os.environ.get(EXTERNAL_REAL_VLLM_ENV)
    if external:
        _announce(request.config, f"[vllm] using the real-vocabulary vLLM at {external} ({EXTERNAL_REAL_VLLM_ENV})")
        yield external_vllm_server(external, real_vocab_model_path, served)
        return
    log_path = tmp_path_factory.mktemp("real-vllm") / "vllm.log"
    env = {
        TOKEN_ENV: str(real_tokenizer.convert_tokens_to_ids("<|im_end|>")),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with running_vllm_server(
        real_vocab_model_path, log_path=log_path, served_model_name=served, extra_args=REAL_VLLM_ARGS, extra_env=env
    ) as server:
        _announce(request.config, f"[vllm] real-vocabulary vLLM: {served} at {server.base_url} (log: {log_path})")
        yield server


@pytest.fixture(scope="session")
def real_tokenizer(real_vocab_model_path: Path) -> Any:
    """The real-vocabulary model's tokenizer: Qwen2.5's ids, special tokens and chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_vocab_model_path)
