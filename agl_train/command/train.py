"""`train(config)`: a whole run from one run file (`run_file`), on the CPU or on GPUs.

Everything is checked before anything starts (the agent, its `env_map` fields, the config). Then, without
a GPU: the proxy (`agl proxy serve --logprobs`: the store and the web view), vLLM in dev mode on a copy of
the model (the trainer overwrites it), optionally one rollout (`preflight`), and `run_ppo_on_cpu`; with GPUs,
the proxy and verl's `run_ppo`. One line per step (`steps`), warnings (`step_warnings`), the reward curve, and
the trained model as a Hugging Face folder with weights (`OUT/trained-model`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .composed import compose_run_config
from .curve import plot_curve
from .run_file import RunFile, check_steps, load_run_file
from .run_store import first_failure, rewards_by_version
from .services import environment, running_proxy, running_vllm
from .step_warnings import StepWarnings
from .steps import StepPrinter

PENDING_URL = "http://127.0.0.1:0"
"""The proxy's URL while the config is checked, before the proxy starts."""
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.pt")


@dataclass(frozen=True)
class TrainResult:
    """What a run left under `out`: the trained model, the curve, the store, the metrics of each step."""

    out: Path
    model: Path | None
    curve: Path | None
    db_path: Path
    history: list[dict[str, float]]
    validations: list[dict[str, float]]
    warnings: list[str]


def train(
    config: str | Path | Mapping[str, Any],
    *,
    out: Path | None = None,
    steps: int | None = None,
    device: str | None = None,
    check_rollout: bool | None = None,
    print_lines: bool = True,
) -> TrainResult:
    """Train the agent a run file (a path, or its contents as a mapping) names; `out`, `steps`, `device`
    and `check_rollout` replace the file's. RunFileError (a ValueError) names the file and the field."""
    run = load_run_file(config, out)
    if steps is not None:
        run = replace(run, steps=check_steps(steps, run.where))
    cpu = (device or run.device) == "cpu" or ((device or run.device) == "auto" and not _has_gpu())
    trainer_config = compose_run_config(run, run.out / "model" if cpu else run.model, PENDING_URL, cpu)
    run.out.mkdir(parents=True, exist_ok=True)
    metrics_path, db_path = run.out / "metrics.jsonl", run.out / "agl.db"
    for stale in (metrics_path, db_path, run.out / "agl.db-wal", run.out / "agl.db-shm"):
        stale.unlink(missing_ok=True)
    say = print if print_lines else _quiet
    warn = StepWarnings(lambda: first_failure(db_path))
    with (
        environment({**run.agent_env(), "VERL_FILE_LOGGER_PATH": str(metrics_path)}),
        running_proxy(run.out) as proxy_url,
    ):
        trainer_config.agentlightning.agl_base_url = proxy_url
        say(f"agl train: {run.where}: {len(run.tasks)} tasks, {run.steps} steps, {'CPU' if cpu else 'GPU'}; "
            f"view: {proxy_url}/ ; run folder: {run.out}", flush=True)  # fmt: skip
        with StepPrinter(metrics_path, print_lines, warn) as printer:
            trained = (
                _train_on_cpu(run, trainer_config, say, check_rollout) if cpu else _train_on_gpus(run, trainer_config)
            )
    curve = _draw_curve(db_path, run.out / "reward-curve.png", run.out.name)
    say(f"reward curve: {curve}" if curve else "reward curve: no rewarded rollout to draw", flush=True)
    say(f"trained model (Hugging Face folder with weights): {trained}", flush=True)
    return TrainResult(run.out, trained, curve, db_path, printer.history, printer.validations, printer.warnings)


def _train_on_cpu(run: RunFile, config: Any, say: Any, check_rollout: bool | None) -> Path:
    """vLLM on a copy of the model, the optional rollout before training, `run_ppo_on_cpu`; the trained model."""
    import torch

    from ..verl_glue.cpu_run import run_ppo_on_cpu
    from .preflight import check_one_rollout

    # Agents, vLLM and the trainer share the cores: a second OpenMP thread per process only spins.
    torch.set_num_threads(1)
    model = run.out / "model"
    shutil.rmtree(model, ignore_errors=True)
    shutil.copytree(run.model, model)
    say(f"starting vLLM on {model} (a minute or more on a CPU); log: {run.out / 'vllm.log'}", flush=True)
    with running_vllm(model, run.out / "vllm.log", run.vllm_args) as address:
        if run.check_rollout if check_rollout is None else check_rollout:
            reward = check_one_rollout(run, f"http://{address}/v1", str(model))
            say(f"one rollout of task 1 before training: reward {reward}", flush=True)
        trainer = run_ppo_on_cpu(config, run.tasks, run.val_tasks, [address], run.out / "weights")
    return export_model(trainer.actor_rollout_wg, run.model, run.out / "trained-model")


def export_model(worker_group: Any, source: Path, target: Path) -> Path:
    """The trained model as a Hugging Face folder: `source`'s config, tokenizer and template, the actor's
    weights (`save_rollout_weights`, what vLLM loads too)."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*WEIGHT_FILES))
    worker_group.save_rollout_weights(str(target))
    return target


def _train_on_gpus(run: RunFile, config: Any) -> Path:
    """verl's path (`run_ppo`: Ray, verl's vLLM replicas), saving the last step; the checkpoint merged into a
    Hugging Face folder by verl's model merger. Not run by agl's tests (no GPU there)."""
    from ..verl_glue.entry import run_ppo

    config.trainer.save_freq = run.steps
    run_ppo(config, run.tasks, run.val_tasks)
    target = run.out / "trained-model"
    actor = run.out / "checkpoints" / f"global_step_{run.steps}" / "actor"
    merge = ["-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor)]
    subprocess.run([sys.executable, *merge, "--target_dir", str(target)], check=True)
    return target


def _draw_curve(db_path: Path, png: Path, title: str) -> Path | None:
    by_version = rewards_by_version(db_path)
    if not by_version:
        return None
    plot_curve(by_version, png, title)
    return png


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _quiet(*args: Any, **kwargs: Any) -> None:
    """`print` when the run prints nothing."""
