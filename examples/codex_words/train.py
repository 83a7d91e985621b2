"""Train the tiny random model through an unmodified Codex CLI: a whole agl + verl run on the CPU.

    python -m examples.codex_words.train [--steps 8] [--out artifacts/codex_words] [--png PATH]

The same run as examples/lowercase_words (vLLM in dev mode, `agl proxy serve --logprobs`, agents
as subprocesses, `AglTrainer.fit()` through `agl_train.verl_glue.cpu_run.run_ppo_on_cpu`, the
trained weights reloaded into vLLM after each step), with the agent of `agent.py`: every rollout
is one `codex exec` through the rollout's base URL, rewarded on its final message. Codex's first
prompt is ~24k tokens, so the model copy's context is raised to 64k positions (vLLM and actor
alike), every micro-batch is one row, and the row limits hold such a prompt.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from examples.lowercase_words import train as lowercase

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "artifacts" / "codex_words"
AGENT_CLASS = "examples.codex_words.agent:CodexWordsAgent"
CONTEXT = 65536  # positions of the model copy: Codex's prompt is ~24k tokens, the tiny model has 2048
TURN_TOKENS = 32  # every turn: 32 sampled tokens, then <|im_end|> (examples/tiny_vllm/end_turn.py)
END_OF_TURN = 2  # <|im_end|> in the tiny model's vocabulary
ROLLOUTS = 4  # per prompt (GRPO group), one prompt per step
REPLACED_KEYS = (
    "agentlightning.local.agent_class",
    "trainer.experiment_name",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.n",
    "data.train_batch_size",
    "agentlightning.rollout_timeout_seconds",
    "trainer.val_before_train",
    "trainer.test_freq",
)


def tasks(tokenizer: Path, count: int, offset: int = 0) -> list[dict[str, str]]:
    """`count` tasks cycling through the lowercase example's prompts, each naming the tokenizer the reward uses."""
    return [task | {"tokenizer": str(tokenizer)} for task in lowercase.tasks(count, offset)]


def overrides(model_path: Path, proxy_url: str, steps: int, out: Path, seed: int = 0) -> list[str]:
    """The lowercase example's config with this agent: one prompt × 4 rollouts a step, one update
    of micro-batches of one row (a row is ~24k tokens: its logits alone are 24k × 2050 floats),
    row limits that hold Codex's prompt, no validation (each validation rollout costs as a training one)."""
    base = [
        override
        for override in lowercase.overrides(model_path, proxy_url, steps, out, seed)
        if override.split("=")[0].lstrip("+") not in REPLACED_KEYS and not override.startswith("agentlightning.trace")
    ]
    return [
        *base,
        f"agentlightning.local.agent_class={AGENT_CLASS}",
        "+agentlightning.local.env_map.TOKENIZER=input.tokenizer",
        "agentlightning.rollout_timeout_seconds=600",
        # One update per step over 4 rollouts, against the lowercase example's two over 16: a larger step.
        "actor_rollout_ref.actor.optim.lr=0.1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        f"actor_rollout_ref.rollout.n={ROLLOUTS}",
        "data.train_batch_size=1",
        "trainer.n_gpus_per_node=1",  # verl checks that a step's rows divide over the "GPUs" (default 8)
        # Codex 0.169.0's first prompt: 23,982 tokens with this vocabulary, plus the task.
        "agentlightning.trace_aggregator.trajectory_max_prompt_length=25600",
        f"agentlightning.trace_aggregator.trajectory_max_response_length={TURN_TOKENS + 1}",
        "data.max_prompt_length=25600",
        f"data.max_response_length={TURN_TOKENS + 1}",  # the per-turn cap fit() has the proxy impose
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.experiment_name=codex_words",
    ]


def train(model_path: Path, vllm_address: str, out: Path, steps: int, seed: int = 0) -> lowercase.Run:
    """`steps` training steps against the vLLM at `vllm_address` (dev mode, serving `model_path`);
    everything the run writes goes under `out`."""
    import torch

    from agl_train.verl_glue.config import compose_config
    from agl_train.verl_glue.cpu_run import run_ppo_on_cpu

    torch.set_num_threads(1)  # as the lowercase example: a second thread only waits on vLLM and the agents
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    tokenizer = model_path / "tokenizer.json"
    with (
        lowercase._environment("VERL_FILE_LOGGER_PATH", str(metrics_path)),
        lowercase.running_proxy(out) as proxy_url,
        lowercase.StepPrinter(metrics_path) as printer,
    ):
        config = compose_config(overrides(model_path, proxy_url, steps, out, seed))
        trainer = run_ppo_on_cpu(
            config, tasks(tokenizer, steps), tasks(tokenizer, 1, offset=1), [vllm_address], out / "weights"
        )
    return lowercase.Run.in_process(printer.history, printer.validations, out / "agl.db", trainer)


def long_context_copy(model: Path, out: Path) -> Path:
    """Copy the tiny model into `out` with `max_position_embeddings` raised to `CONTEXT`: vLLM
    sizes its rotary cache by it (past it the logits are NaN), and verl refuses a longer context
    than it allows. The weights are random; nothing else changes."""
    shutil.copytree(model, out)
    config_path = out / "config.json"
    config: dict[str, Any] = json.loads(config_path.read_text())
    config["max_position_embeddings"] = CONTEXT
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return out


@contextlib.contextmanager
def fresh_run(out: Path) -> Iterator[tuple[Path, str]]:
    """Empty `out`, copy the tiny model with a long context into `out/model` and serve it with a
    dev-mode vLLM whose turns end after `TURN_TOKENS` tokens: yields the model path and vLLM's address."""
    import os

    from examples.tiny_vllm.end_turn import AFTER_ENV, TOKEN_ENV
    from examples.tiny_vllm.tiny_model import DEFAULT_DIR
    from examples.tiny_vllm.vllm_server import build_tiny_model, running_vllm_server

    shutil.rmtree(out, ignore_errors=True)
    model = long_context_copy(build_tiny_model(DEFAULT_DIR), out / "model")
    extra_args = (
        "--max-model-len", str(CONTEXT),
        "--kv-cache-memory-bytes", str(512 * 1024 * 1024),  # 4 rollouts × ~25 MiB of KV cache each, and room
        "--logits-processors", "examples.tiny_vllm.end_turn:EndTurnAfter",
        "--enable-scale-out",  # the token-in endpoints of the proxy's token chain, as the trainer's vLLM has them
    )  # fmt: skip
    env = {
        "VLLM_SERVER_DEV_MODE": "1",
        AFTER_ENV: str(TURN_TOKENS),
        TOKEN_ENV: str(END_OF_TURN),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    print(f"starting vLLM on {model} (about a minute on a CPU)", flush=True)
    with running_vllm_server(model, log_path=out / "vllm.log", extra_args=extra_args, extra_env=env) as vllm:
        yield model, vllm.base_url.removeprefix("http://").removesuffix("/v1")


def main(argv: Sequence[str] | None = None) -> int:
    parser = lowercase.example_parser((__doc__ or "").splitlines()[0], DEFAULT_OUT)
    parser.set_defaults(steps=8)
    args = parser.parse_args(argv)
    started = time.monotonic()
    out: Path = args.out.resolve()
    with fresh_run(out) as (model, address):
        train(model, address, out, args.steps, args.seed)
    title = "codex-words task (Codex CLI, one call a rollout), tiny model, CPU"
    lowercase.report(out, args.steps, args.png or out / "training-curve.png", title, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
