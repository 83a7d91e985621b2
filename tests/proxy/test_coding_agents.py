"""Coding agents, unmodified, through `agl proxy serve` against the tiny vLLM on the CPU.

Codex CLI (installed from npm into `.cache/codex` by scripts/setup.sh) runs `codex exec` with its
model provider pointed at a rollout's base URL (`wire_api = "responses"`); Claude Code runs the
same way when `claude` is on PATH (its licence is Anthropic's own, so scripts/setup.sh does not
install it; `npm install --prefix /tmp/claude @anthropic-ai/claude-code` and that prefix's
`node_modules/.bin` on PATH runs it). The tiny random model's turns go
as a trained one's do because its vLLM runs `examples.tiny_vllm.end_turn.EndTurnAfter`: no stop
token before 8 tokens, then only `<|im_end|>`. Everything else is real: the agent's own
requests, the proxy, vLLM's sampling, the spans with their token ids.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agl_store.client import LightningStoreClient
from examples.codex_words.agent import CODEX, codex_config
from examples.tiny_vllm.end_turn import AFTER_ENV, TOKEN_ENV
from examples.tiny_vllm.vllm_server import VLLMServer, running_vllm_server

from .helpers import wait_for_spans
from .test_cli import _start, _stop

ROOT = Path(__file__).resolve().parents[2]
END_OF_TURN = 2  # <|im_end|> in the tiny model's vocabulary
TURN_TOKENS = 8
AGENT_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def ending_vllm(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A vLLM of its own: a context long enough for an agent's prompt (24k tokens for Codex's first
    with the tiny vocabulary), and turns that end. The tiny model's positions go up to 2048: vLLM's
    rotary cache is sized by `max_position_embeddings`, so it is raised too (past the cache, the
    model reads garbage and its logits are NaN); the model is random, so nothing else changes."""
    extra_args = (
        "--max-model-len", "65536",
        "--hf-overrides", json.dumps({"max_position_embeddings": 65536}),
        "--kv-cache-memory-bytes", str(256 * 1024 * 1024),
        "--logits-processors", "examples.tiny_vllm.end_turn:EndTurnAfter",
        "--enable-scale-out",  # as the docs start vLLM: the agents' calls go through the token chain
    )  # fmt: skip
    env = {
        AFTER_ENV: str(TURN_TOKENS),
        TOKEN_ENV: str(END_OF_TURN),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    log_path = tmp_path_factory.mktemp("ending-vllm") / "vllm.log"
    with running_vllm_server(tiny_model_path, log_path=log_path, extra_args=extra_args, extra_env=env) as server:
        yield server


@pytest.mark.skipif(not CODEX.exists(), reason="Codex CLI is not installed in .cache/codex (scripts/setup.sh)")
@pytest.mark.parametrize("cap", [None, TURN_TOKENS // 2], ids=["turns-end", "turns-capped"])
async def test_codex_exec_runs_a_task_through_the_proxy(
    ending_vllm: VLLMServer, tmp_path: Path, cap: int | None
) -> None:
    # With a cap below the model's turn, every turn is cut (finish_reason length), and Codex goes on as after any turn.
    sampling = ("--sampling", f"all.max_tokens={cap}") if cap else ()
    process, url = await _start(
        "--backend", ending_vllm.base_url, "--model", ending_vllm.model, "--alias", f"*={ending_vllm.model}",
        "--db", str(tmp_path / "agl.db"), *sampling,
    )  # fmt: skip
    try:
        store = LightningStoreClient(url)
        rollout = await store.start_rollout(input={"task": "say hello"})
        base_url = f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1"
        home, work = tmp_path / "codex-home", tmp_path / "work"
        home.mkdir()
        work.mkdir()
        (home / "config.toml").write_text(codex_config(base_url, retries=0))
        last = tmp_path / "last-message.txt"
        agent = await asyncio.create_subprocess_exec(
            str(CODEX), "exec", "--skip-git-repo-check", "--sandbox", "read-only",
            "--output-last-message", str(last), "Say hello.",
            cwd=work,
            env={**os.environ, "CODEX_HOME": str(home), "HOME": str(tmp_path)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await asyncio.wait_for(agent.communicate(), AGENT_TIMEOUT_S)
        assert agent.returncode == 0, output.decode(errors="replace")[-3000:]

        spans = await wait_for_spans(store, rollout.rollout_id, 1)
        await store.close()
    finally:
        await _stop(process)

    assert spans, output.decode(errors="replace")[-3000:]
    for span in spans:
        attributes = span.attributes
        assert attributes["agl.api"] == "responses" and attributes["gen_ai.request.model"] == "gpt-5.1-codex"
        assert attributes["agl.token_ids.status"] == "ok"
        assert attributes["agl.tools_left_out"] == ["web_search"]
        choice = attributes["agl.choices"][0]
        if cap is None:
            assert choice["finish_reason"] == "stop" and choice["token_ids"][-1] == END_OF_TURN, choice
            assert len(choice["token_ids"]) == TURN_TOKENS + 1, choice  # N tokens, then <|im_end|>
        else:
            assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == cap, choice
        assert len(attributes["agl.prompt_token_ids"]) > 2000  # Codex's instructions and tools
    # The agent ended as it does when the model answers in text: its last message is the model's.
    answer = spans[-1].attributes["agl.response"]["choices"][0]["message"]["content"]
    assert last.read_text().strip() == lines(answer or "").strip()  # Codex writes a carriage return as a newline


def lines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


@pytest.mark.skipif(shutil.which("claude") is None, reason="Claude Code (`claude`) is not on PATH")
async def test_claude_code_runs_a_task_through_the_proxy(ending_vllm: VLLMServer, tmp_path: Path) -> None:
    process, url = await _start(
        "--backend", ending_vllm.base_url, "--model", ending_vllm.model, "--alias", f"*={ending_vllm.model}",
        "--db", str(tmp_path / "agl.db"),
    )  # fmt: skip
    try:
        store = LightningStoreClient(url)
        rollout = await store.start_rollout(input={"task": "say hello"})
        base_url = f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}"
        env = {**os.environ, "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "agl", "HOME": str(tmp_path)}
        agent = await asyncio.create_subprocess_exec(
            "claude", "-p", "Say hello.", cwd=tmp_path, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await asyncio.wait_for(agent.communicate(), AGENT_TIMEOUT_S)
        assert agent.returncode == 0, output.decode(errors="replace")[-3000:]
        spans = await wait_for_spans(store, rollout.rollout_id, 1)
        await store.close()
    finally:
        await _stop(process)
    assert spans and all(span.attributes["agl.token_ids.status"] == "ok" for span in spans)
    assert all(span.attributes["agl.api"] == "messages" for span in spans)
