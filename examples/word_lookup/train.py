"""Train the tiny real-vocabulary model on a three-turn, tool-using task: a whole agl + verl run on the CPU.

    python -m examples.word_lookup.train [--steps 16] [--level trajectory|transition] [--out DIR] [--png PATH]

The same run as examples/lowercase_words (vLLM in dev mode, `agl proxy serve --logprobs`, agents
as subprocesses, `AglTrainer.fit()` through `agl_train.verl_glue.cpu_run.run_ppo_on_cpu`), on the
tiny model with Qwen2.5's vocabulary and chat template (examples/tiny_vllm/real_vocab.py), its vLLM
serving token in, token out (`--enable-scale-out`), and with the agent of `agent.py`: three model
calls per rollout with the `lookup` tool offered in each, its results appended between them,
rewarded on every turn. At the trajectory level (default) the proxy bridges each follow-up's
prompt from the model's own ids, so the calls of a rollout merge into one row, the inserted tool
results and template glue masked out.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from agl_train.command.services import environment
from agl_train.command.steps import StepPrinter
from examples.lowercase_words import train as lowercase

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "artifacts" / "word_lookup"
AGENT_CLASS = "examples.word_lookup.agent:WordLookupAgent"
REPLACED_KEYS = (
    "agentlightning.local.agent_class",
    "agentlightning.local.env_map.PROMPT",
    "trainer.experiment_name",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.optim.lr",
)
LIMITS = {
    # Prompts run from ~160 tokens (the template's tool preamble) to ~290 (the third call: each
    # call adds its 8-token answer and ~60 inserted tokens: the agent's lookup call, the tool
    # result and the turn markers); a row that starts at a later call, after a prefix break, has
    # such a prompt. A trajectory row's response (three answers and what came between) is ~145.
    "trajectory": [
        "agentlightning.trace_aggregator.trajectory_max_prompt_length=384",
        "agentlightning.trace_aggregator.trajectory_max_response_length=256",
    ],
    "transition": ["data.max_prompt_length=384", "data.max_response_length=8"],
}
VLLM_ARGS = ("--enable-scale-out",)  # the token-in endpoints the proxy's token chain calls


@contextlib.contextmanager
def fresh_run(out: Path) -> Iterator[tuple[Path, str]]:
    """Empty `out`, copy the real-vocabulary model into `out/model` (vLLM reloads trained weights
    there; the cache stays as built) and serve it with a dev-mode vLLM that takes token ids:
    yields the model path and vLLM's address."""
    from examples.tiny_vllm.real_vocab import QWEN2_5
    from examples.tiny_vllm.vllm_server import build_real_vocab_model, running_vllm_server

    model = out / "model"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(build_real_vocab_model(QWEN2_5), model)
    print(f"starting vLLM on {model} (about a minute on a CPU)", flush=True)
    with running_vllm_server(
        model,
        log_path=out / "vllm.log",
        served_model_name=QWEN2_5.served_model_name,
        extra_args=VLLM_ARGS,
        extra_env={"VLLM_SERVER_DEV_MODE": "1"},
    ) as vllm:
        yield model, vllm.base_url.removeprefix("http://").removesuffix("/v1")


TURN_COUNTER = "Turn {turn} of 3."
"""The system prompt of every eighth task: rewritten each turn, it splits those rollouts into a row per call."""


def tasks(count: int, offset: int = 0) -> list[dict[str, Any]]:
    """`count` tasks cycling through the lowercase example's 8 prompts; the last prompt's tasks
    have a turn counter in their system prompt."""
    cycle = len(lowercase.PROMPTS)
    return [
        {"prompt": prompt["prompt"]} | ({"system": TURN_COUNTER} if (offset + i) % cycle == cycle - 1 else {})
        for i, prompt in enumerate(lowercase.tasks(count, offset))
    ]


def train_tasks() -> list[dict[str, Any]]:
    """The tasks of `train.yaml` (`agl train`): 4 a step for its 16 steps."""
    return tasks(4 * 16)


def val_tasks() -> list[dict[str, Any]]:
    """The validation tasks of `train.yaml`, as `train()` validates."""
    return tasks(4, offset=1)


def overrides(
    model_path: Path, proxy_url: str, steps: int, out: Path, level: str, seed: int = 0, extra: Sequence[str] = ()
) -> list[str]:
    """The lowercase example's config (4 prompts × 4 rollouts, two mini-batches per step) with this
    agent, the aggregator `level` and its length limits, a smaller learning rate, then `extra`."""
    base = [
        override
        for override in lowercase.overrides(model_path, proxy_url, steps, out, seed)
        if override.split("=")[0].lstrip("+") not in REPLACED_KEYS and not override.startswith("agentlightning.trace")
    ]
    return [
        *base,
        f"agentlightning.local.agent_class={AGENT_CLASS}",
        f"agentlightning.trace_aggregator.level={level}",
        # verl's log-prob pass takes whole micro-batches; agl's update batch is whole mini-batches
        # of 8 rows (2 × rollout.n), 8, 16, 24... rows here, which the lowercase example's 16 does not divide.
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        # At the lowercase example's 0.05 the reward often fell from ~0.5 to under 0.1 for a step or
        # two before climbing back (2 of 4 runs); at 0.03 it climbed without a dip in 4 of 4, by step 6.
        "actor_rollout_ref.actor.optim.lr=0.03",
        *LIMITS[level],
        "trainer.experiment_name=word_lookup",
        *extra,
    ]


def train(
    model_path: Path,
    vllm_address: str,
    out: Path,
    steps: int,
    *,
    level: str = "trajectory",
    seed: int = 0,
    print_lines: bool = True,
    extra: Sequence[str] = (),
    train_tasks: Sequence[dict[str, Any]] | None = None,
) -> lowercase.Run:
    """`steps` training steps against the vLLM at `vllm_address` (dev mode, serving `model_path`);
    everything the run writes goes under `out`. `extra` overrides come last; `train_tasks`
    replace the default tasks (4 per step)."""
    import torch

    from agl_train.verl_glue.config import compose_config
    from agl_train.verl_glue.cpu_run import run_ppo_on_cpu

    torch.set_num_threads(1)  # as the lowercase example: a second thread only waits on vLLM and the agents
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    for stale in (metrics_path, out / "agl.db", out / "agl.db-wal", out / "agl.db-shm"):
        stale.unlink(missing_ok=True)
    with (
        environment({"VERL_FILE_LOGGER_PATH": str(metrics_path)}),
        lowercase.running_proxy(out) as proxy_url,
        StepPrinter(metrics_path, print_lines) as printer,
    ):
        config = compose_config(overrides(model_path, proxy_url, steps, out, level, seed, extra))
        trainer = run_ppo_on_cpu(
            config,
            list(train_tasks) if train_tasks is not None else tasks(4 * steps),
            tasks(4, offset=1),
            [vllm_address],
            out / "weights",
        )
    return lowercase.Run.in_process(printer.history, printer.validations, out / "agl.db", trainer)


def main(argv: Sequence[str] | None = None) -> int:
    parser = lowercase.example_parser((__doc__ or "").splitlines()[0], DEFAULT_OUT)
    parser.add_argument("--level", choices=sorted(LIMITS), default="trajectory")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out: Path = args.out.resolve()
    with fresh_run(out) as (model, address):
        train(model, address, out, args.steps, level=args.level, seed=args.seed)
    title = f"word-lookup task (3 turns, {args.level} rows), tiny real-vocabulary model, CPU"
    lowercase.report(out, args.steps, args.png or out / "training-curve.png", title, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
