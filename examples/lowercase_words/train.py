"""Train the tiny random model to write lowercase words: a whole agl + verl run on the CPU.

    python -m examples.lowercase_words.train [--steps 16] [--out artifacts/lowercase_words] [--png PATH]
    python -m examples.lowercase_words.train --ray --workers 2

What runs: a vLLM server (dev mode, for in-place weight reloads) on a copy of the test suite's
tiny model, `agl proxy serve` with its embedded SQLite store, and `AglTrainer.fit()` with agents
as local subprocesses. By default through `agl_train.verl_glue.cpu_run.run_ppo_on_cpu` (verl's actor
update in this process); with `--ray`, through `agl_train.verl_glue.entry.run_ppo` on a local Ray cluster:
verl's `RayWorkerGroup` of `--workers` processes, FSDP2 sharding the actor across them over gloo.
One line per step; at the end the training curve goes to `--png`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_train.command import services
from agl_train.command.curve import plot_curve
from agl_train.command.run_store import rewards_by_version
from agl_train.command.steps import StepPrinter

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "artifacts" / "lowercase_words"
AGENT_CLASS = "examples.lowercase_words.agent:LowercaseWordsAgent"
PROMPTS = (
    "Tell me about the weather.",
    "What is the agent doing?",
    "Write one sentence.",
    "Say hello to the user.",
    "Describe the city.",
    "Name a tool.",
    "What happened today?",
    "Answer the question.",
)


def tasks(count: int, offset: int = 0) -> list[dict[str, str]]:
    """`count` tasks `{"prompt": ...}` cycling through the fixed prompts."""
    return [{"prompt": PROMPTS[(offset + i) % len(PROMPTS)]} for i in range(count)]


def train_tasks() -> list[dict[str, str]]:
    """The tasks of `train.yaml` (`agl train`): 4 a step for its 16 steps."""
    return tasks(4 * 16)


def val_tasks() -> list[dict[str, str]]:
    """The validation tasks of `train.yaml`, as `train()` validates."""
    return tasks(4, offset=1)


def overrides(
    model_path: Path, proxy_url: str, steps: int, out: Path, seed: int = 0, workers: int | None = None
) -> list[str]:
    """The run's config over agl's defaults (GRPO, no critic, sdpa without flash-attn): 4 prompts × 4 rollouts
    per step, one mini-batch per step, on the CPU; with `workers`, in that many Ray worker processes."""
    # The step's 16 rows (8 a mini-batch) are split over the workers; verl wants whole micro-batches on each.
    distributed = [
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={workers}",
        "trainer.nnodes=1",
        "actor_rollout_ref.actor.strategy=fsdp2",  # FSDP1 cannot shard CPU tensors (agl_train/verl_glue/cpu_workers.py)
        "actor_rollout_ref.ref.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={8 // workers}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={16 // workers}",
    ] if workers else []  # fmt: skip
    return [
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.actor.strategy=fsdp",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",  # compiling costs more than it saves here
        # At 0.1 the tiny model learned in fewer steps, but about one run in five jumped in one update
        # (per-token KL ~1.6) onto a single non-word token: every reward 0, no advantage, no way back.
        "actor_rollout_ref.actor.optim.lr=0.05",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",  # a small lr by the end keeps the learned policy
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        f"actor_rollout_ref.actor.data_loader_seed={seed}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.temperature=1.0",
        "data.train_batch_size=4",
        f"data.seed={seed}",
        "data.dataloader_num_workers=0",
        "agentlightning.trace_aggregator.trajectory_max_prompt_length=128",
        "agentlightning.trace_aggregator.trajectory_max_response_length=32",
        f"agentlightning.agl_base_url={proxy_url}",
        "agentlightning.rollout_timeout_seconds=120",
        f"agentlightning.local.agent_class={AGENT_CLASS}",
        "+agentlightning.local.env_map.PROMPT=input.prompt",
        "trainer.total_epochs=1",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[file]",
        "trainer.val_before_train=true",
        f"trainer.test_freq={steps}",  # validate before the first step and after the last
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        "trainer.project_name=agl-examples",
        "trainer.experiment_name=lowercase_words",
        *distributed,
    ]


@contextlib.contextmanager
def running_proxy(out: Path) -> Iterator[str]:
    """`agl proxy serve` with its store in `out/agl.db` (`agl_train.command.services.running_proxy`),
    run from the repository."""
    with services.running_proxy(out, cwd=REPO) as url:
        yield url


def _environment(name: str, value: str) -> contextlib.AbstractContextManager[None]:
    """One environment variable set for the run (`agl_train.command.services.environment`)."""
    return services.environment({name: value})


@dataclass
class Run:
    """What a training run leaves: per-step metrics, validations outside a step, the store file, the
    trainer (None when it ran in a Ray actor), and what each of the actor's worker processes held
    (`agl_train.verl_glue.entry.TrainedActor.param_numel`; one unsharded process without Ray)."""

    history: list[dict[str, float]]
    validations: list[dict[str, float]]
    db_path: Path
    trainer: Any
    param_numel: list[tuple[int, int]]

    @property
    def world_size(self) -> int:
        return len(self.param_numel)

    @classmethod
    def in_process(
        cls, history: list[dict[str, float]], validations: list[dict[str, float]], db_path: Path, trainer: Any
    ) -> Run:
        """The run of `run_ppo_on_cpu`: one process holding the whole actor."""
        params = sum(p.numel() for p in trainer.actor_rollout_wg.model.parameters())
        return cls(history, validations, db_path, trainer, [(params, params)])


def train(
    model_path: Path,
    vllm_address: str,
    out: Path,
    steps: int,
    seed: int = 0,
    print_lines: bool = True,
    workers: int | None = None,
    extra: Sequence[str] = (),
) -> Run:
    """`steps` training steps against the vLLM at `vllm_address`, which must serve `model_path`
    in dev mode (`VLLM_SERVER_DEV_MODE=1`); everything the run writes goes under `out`. With
    `workers`, on a local Ray cluster in that many worker processes (started here unless Ray
    runs already; the caller shuts it down). `extra`: more config overrides."""
    import torch

    from agl_train.verl_glue.config import compose_config
    from agl_train.verl_glue.cpu_run import run_ppo_on_cpu
    from agl_train.verl_glue.cpu_workers import ExternalRollout
    from agl_train.verl_glue.entry import run_ppo

    # A 345 K-parameter model gains nothing from a second thread, and OpenMP threads spinning
    # against vLLM and the agents for two cores made each update ~10x slower (measured).
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    for stale in (metrics_path, out / "agl.db", out / "agl.db-wal", out / "agl.db-shm"):
        stale.unlink(missing_ok=True)
    trainer, param_numel = None, []
    with (
        _environment("VERL_FILE_LOGGER_PATH", str(metrics_path)),  # where verl's file logger writes
        running_proxy(out) as proxy_url,
        StepPrinter(metrics_path, print_lines) as printer,
    ):
        config = compose_config([*overrides(model_path, proxy_url, steps, out, seed, workers), *extra])
        train_tasks, val_tasks = tasks(4 * steps), tasks(4, offset=1)
        if workers:
            rollout = ExternalRollout([vllm_address], out / "weights")
            param_numel = run_ppo(config, train_tasks, val_tasks, rollout=rollout).param_numel
        else:
            trainer = run_ppo_on_cpu(config, train_tasks, val_tasks, [vllm_address], out / "weights")
    if trainer is not None:
        return Run.in_process(printer.history, printer.validations, out / "agl.db", trainer)
    return Run(printer.history, printer.validations, out / "agl.db", None, param_numel)


def improvement(by_version: dict[int, list[float]], window: int) -> dict[str, float]:
    """Mean reward of the rollouts of the first and the last `window` steps, their difference,
    and the run's own noise: two standard errors of that difference, from the per-rollout rewards."""
    steps = sorted(by_version)
    first = [r for step in steps[:window] for r in by_version[step]]
    last = [r for step in steps[-window:] for r in by_version[step]]

    def mean_and_var(values: Sequence[float]) -> tuple[float, float]:
        mean = sum(values) / len(values)
        return mean, sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)

    (first_mean, first_var), (last_mean, last_var) = mean_and_var(first), mean_and_var(last)
    band = 2.0 * math.sqrt(first_var / len(first) + last_var / len(last))
    return {"first": first_mean, "last": last_mean, "gain": last_mean - first_mean, "band": band}


@contextlib.contextmanager
def fresh_run(out: Path) -> Iterator[tuple[Path, str]]:
    """Empty `out`, copy the tiny model into `out/model` (vLLM reloads trained weights there; the
    cache stays as built) and serve it with a dev-mode vLLM: yields the model path and vLLM's address."""
    from examples.tiny_vllm.tiny_model import DEFAULT_DIR
    from examples.tiny_vllm.vllm_server import build_tiny_model, running_vllm_server

    model = out / "model"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(build_tiny_model(DEFAULT_DIR), model)
    print(f"starting vLLM on {model} (about a minute on a CPU)", flush=True)
    with running_vllm_server(model, log_path=out / "vllm.log", extra_env={"VLLM_SERVER_DEV_MODE": "1"}) as vllm:
        yield model, vllm.base_url.removeprefix("http://").removesuffix("/v1")


def report(out: Path, steps: int, png: Path, title: str, started: float) -> None:
    """Draw the run's curve into `png` and print the reward of its first and last quarter against the noise band."""
    by_version = rewards_by_version(out / "agl.db")
    result = improvement(by_version, window=max(1, steps // 4))
    plot_curve(by_version, png, title)
    print(
        f"reward {result['first']:.3f} (first steps) -> {result['last']:.3f} (last steps), gain {result['gain']:+.3f}"
        f" vs noise band {result['band']:.3f}; curve: {png}; {time.monotonic() - started:.0f} s in all",
        flush=True,
    )


def example_parser(description: str, default_out: Path) -> argparse.ArgumentParser:
    """The options of a training example: --steps, --seed, --out, --png."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=default_out, help="run directory (model copy, store, logs)")
    parser.add_argument("--png", type=Path, default=None, help="training curve (default OUT/training-curve.png)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = example_parser(__doc__.splitlines()[0], DEFAULT_OUT)
    parser.add_argument("--ray", action="store_true", help="verl's Ray worker group and FSDP instead of one process")
    parser.add_argument("--workers", type=int, default=2, help="with --ray: actor worker processes (FSDP ranks)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out: Path = args.out.resolve()
    with fresh_run(out) as (model, address):
        run = train(model, address, out, args.steps, args.seed, workers=args.workers if args.ray else None)
    if args.ray:
        import ray

        ray.shutdown()
    print(f"actor world size {run.world_size}", flush=True)
    report(out, args.steps, args.png or out / "training-curve.png", "lowercase-words task, tiny model, CPU", started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
