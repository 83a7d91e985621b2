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
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
PROXY_START_TIMEOUT_S = 60.0


def tasks(count: int, offset: int = 0) -> list[dict[str, str]]:
    """`count` tasks `{"prompt": ...}` cycling through the fixed prompts."""
    return [{"prompt": PROMPTS[(offset + i) % len(PROMPTS)]} for i in range(count)]


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
    """`agl proxy serve` with no backend (the trainer registers vLLM) and its embedded store in
    `out/agl.db`, logging the sampled tokens' logprobs; yields its URL, stops it on exit."""
    (out / "models.yaml").write_text("model_list: []\n")
    log_path = out / "proxy.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "agl_store.cli", "proxy", "serve", "--config", str(out / "models.yaml"),
             "--db", str(out / "agl.db"), "--port", "0", "--logprobs"],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip
    try:
        yield _wait_for_listening(process, log_path)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for_listening(process: subprocess.Popen[bytes], log_path: Path) -> str:
    deadline = time.monotonic() + PROXY_START_TIMEOUT_S
    while time.monotonic() < deadline:
        match = re.search(r"listening on (http://\S+)", log_path.read_text(errors="replace"))
        if match:
            return match.group(1)
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"agl proxy serve did not start:\n{log_path.read_text(errors='replace')[-2000:]}")


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


class StepPrinter:
    """Follows verl's file logger (`trainer.logger=[file]`) and prints one line per step."""

    HEADER = "step  reward    pg_loss    rows  tokens/s  rollout_s  update_s  sync_s"

    def __init__(self, path: Path, print_lines: bool = True) -> None:
        self.path = path
        self.print_lines = print_lines
        self.history: list[dict[str, float]] = []
        self.validations: list[dict[str, float]] = []  # the metrics of validations outside a step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="step-printer", daemon=True)

    def __enter__(self) -> StepPrinter:
        if self.print_lines:
            print(self.HEADER, flush=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _follow(self) -> None:
        offset = 0
        while True:
            stopping = self._stop.is_set()
            if self.path.exists():
                with open(self.path, "rb") as handle:
                    handle.seek(offset)
                    for line in handle:
                        if not line.endswith(b"\n"):
                            break
                        offset += len(line)
                        self._step(json.loads(line))
            if stopping:
                return
            time.sleep(0.2)

    def _step(self, record: dict[str, Any]) -> None:
        metrics = {"step": float(record["step"]), **record["data"]}
        if "training/global_step" in metrics:
            self.history.append(metrics)
        else:
            self.validations.append(metrics)
        if self.print_lines:
            print(format_step(metrics), flush=True)


def format_step(m: dict[str, float]) -> str:
    """One step as a line: reward, actor/pg_loss, rows, tokens/s, seconds in rollout / update / sync
    (and the validation reward when the step validated); a validation before training as its own line."""
    validation = f"  val reward {m['val/reward_mean']:.3f}" if "val/reward_mean" in m else ""
    if "training/global_step" not in m:
        return f"{int(m['step']):>4}{validation.rstrip()}"
    update_s = m.get("timing_s/old_log_prob", 0.0) + m.get("timing_s/update_actor", 0.0)
    tokens_per_s = m.get("training/n_tokens", 0.0) / max(m.get("timing_s/step", 0.0), 1e-9)
    return (
        f"{int(m['step']):>4}  {m.get('rollout/reward_mean', math.nan):6.3f}  {m.get('actor/pg_loss', math.nan):+.2e}"
        f"  {int(m.get('training/n_update_rows', 0)):>6}  {tokens_per_s:8.0f}  {m.get('timing_s/gen', math.nan):9.2f}"
        f"  {update_s:8.2f}  {m.get('timing_s/update_weights', math.nan):6.2f}{validation}"
    )


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


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def rewards_by_version(db_path: Path) -> dict[int, list[float]]:
    """Per-rollout rewards of the training rollouts in the store at `db_path`, by the weight
    version (`agl.model_version`, the step) of their model call."""
    from agl_store import call_span
    from agl_store.sqlite import SQLiteStore
    from agl_train.core.traces import final_reward

    async def read() -> dict[int, list[float]]:
        store = await SQLiteStore(str(db_path)).open()
        try:
            by_version: dict[int, list[float]] = {}
            for rollout in await store.query_rollouts(mode="train", status_in=["succeeded"]):
                spans = await store.query_spans(rollout.rollout_id, "latest")
                versions = {s.attributes.get(call_span.MODEL_VERSION) for s in spans if s.name == call_span.NAME}
                reward = final_reward(spans)
                if len(versions) == 1 and reward is not None:
                    by_version.setdefault(int(versions.pop()), []).append(reward)
            return by_version
        finally:
            await store.close()

    return asyncio.run(read())


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


def plot_curve(
    by_version: dict[int, list[float]], path: Path, title: str = "lowercase-words task, tiny model, CPU"
) -> None:
    """The training curve as a PNG: each rollout's reward (dots) and the step mean ± one standard
    deviation, by step. Drawn with Pillow (no plotting library needed)."""
    from PIL import Image, ImageDraw, ImageFont

    width, height, left, right, top, bottom = 720, 420, 70, 20, 40, 50
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    steps = sorted(by_version)
    x_min, x_max = steps[0] - 0.5, steps[-1] + 0.5

    def xy(step: float, reward: float) -> tuple[float, float]:
        x = left + (step - x_min) / (x_max - x_min) * (width - left - right)
        return x, top + (1.0 - reward) * (height - top - bottom)

    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        _, y = xy(x_min, tick)
        draw.line([(left, y), (width - right, y)], fill=(230, 230, 230))
        draw.text((left - 40, y - 6), f"{tick:.2f}", fill="black", font=font)
    for step in steps:
        x, _ = xy(step, 0.0)
        draw.text((x - 4, height - bottom + 8), str(step), fill="black", font=font)
    means, bands = [], []
    for step in steps:
        rewards = by_version[step]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        for reward in rewards:
            x, y = xy(step, reward)
            draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=(160, 190, 230))
        means.append(xy(step, mean))
        bands.append((xy(step, min(1.0, mean + std)), xy(step, max(0.0, mean - std))))
    for upper, lower in bands:
        draw.line([upper, lower], fill=(30, 90, 180), width=2)
    draw.line(means, fill=(200, 40, 40), width=3)
    for x, y in means:
        draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=(200, 40, 40))
    draw.rectangle([left, top, width - right, height - bottom], outline="black")
    draw.text((left, 12), f"{title}: reward per rollout (dots), step mean (red) ± std", fill="black", font=font)
    draw.text(((width - left) // 2, height - 20), "training step (weight version)", fill="black", font=font)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


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
