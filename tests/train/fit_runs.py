"""Small `AglTrainer.fit()` runs of the lowercase-words task (examples/lowercase_words) for the
async and resume tests: its config with a few keys changed, in this process or as a trainer
subprocess (`python -m tests.train.fit_runs ARGS_JSON`), against an `agl proxy serve` the
caller runs, so that a run can be killed and resumed on the same store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples.lowercase_words.train import REPO, Run, StepPrinter, _environment, overrides

SDK_AGENT = "tests.train.agents:SdkLowercaseAgent"
N = 2  # rollouts per prompt
BATCH = 2  # data.train_batch_size: groups trained per step
IN_FLIGHT = 4  # async_train_batch_size


def unique_tasks(count: int) -> list[dict[str, str]]:
    """`count` tasks with distinct prompts, so the store tells which prompt was rolled out how often."""
    return [{"prompt": f"Task {i}: write one short sentence."} for i in range(count)]


def run_overrides(model_path: Path, proxy_url: str, out: Path, changes: Sequence[str]) -> list[str]:
    """The example's config (as `examples.lowercase_words.train.overrides`) with `changes` after it (they win)."""
    # One "GPU": verl checks that data.train_batch_size × rollout.n divides over them. Micro-batches
    # of 2 rows: a step's update has whole mini-batches of one prompt's 2 rollouts.
    small = [
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    ]
    return [*overrides(model_path, proxy_url, 1, out), *small, *changes]


def async_overrides(model_path: Path, proxy_url: str, out: Path, changes: Sequence[str]) -> list[str]:
    """`run_overrides` for an async run of the SDK agent: `IN_FLIGHT` groups of `N` in flight,
    `BATCH` trained per step, a run that the data ends (not `trainer.total_training_steps`)."""
    return run_overrides(
        model_path,
        proxy_url,
        out,
        [
            f"agentlightning.local.agent_class={SDK_AGENT}",
            "agentlightning.async_rollout.enabled=true",
            f"agentlightning.async_rollout.async_train_batch_size={IN_FLIGHT}",
            f"actor_rollout_ref.rollout.n={N}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            f"data.train_batch_size={BATCH}",
            "trainer.total_training_steps=100",
            *changes,
        ],
    )


def fit(config_overrides: Sequence[str], out: Path, train_tasks: list[Any], val_tasks: list[Any], address: str) -> Run:
    """`run_ppo_on_cpu` in this process; the metrics of each step come back from verl's file logger."""
    import torch

    from agl_train.verl_glue.config import compose_config
    from agl_train.verl_glue.cpu_run import run_ppo_on_cpu

    torch.set_num_threads(1)  # as examples/lowercase_words: one thread is fastest next to vLLM and the agents
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    with _environment("VERL_FILE_LOGGER_PATH", str(metrics_path)), StepPrinter(metrics_path, False) as printer:
        trainer = run_ppo_on_cpu(compose_config(config_overrides), train_tasks, val_tasks, [address], out / "weights")
    return Run.in_process(printer.history, printer.validations, out / "agl.db", trainer)


def start_fit(
    config_overrides: Sequence[str], out: Path, train_tasks: list[Any], val_tasks: list[Any], address: str
) -> subprocess.Popen[bytes]:
    """`fit(...)` in a trainer subprocess (its output in `out/trainer.log`)."""
    out.mkdir(parents=True, exist_ok=True)
    args = {"overrides": list(config_overrides), "out": str(out), "address": address}
    args |= {"train": train_tasks, "val": val_tasks}
    with open(out / "trainer.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.train.fit_runs", json.dumps(args)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=trainer_env(),
        )


def trainer_env() -> dict[str, str]:
    """This process's environment without the torch.distributed rendezvous a trainer run here set
    up (the child's own would collide with it on the port)."""
    env = {key: value for key, value in os.environ.items() if key not in ("MASTER_ADDR", "MASTER_PORT")}
    return env | {"PYTHONPATH": str(REPO)}


def main() -> None:
    args = json.loads(sys.argv[1])
    fit(args["overrides"], Path(args["out"]), args["train"], args["val"], args["address"])


if __name__ == "__main__":
    main()
