"""A few real verl steps with agl's trainer on the tiny model: the GPU check.

Run through `tests/gpu/run_gpu_check.sh` (it starts the proxy first, with `--logprobs`, so the
spans carry vLLM's logprobs). Three runs on one GPU with agl's defaults (`agl_train/config.yaml`:
GRPO, no critic, console + file logger, attention `auto`) plus the sizes of a one-GPU run:

1. `tools`: `--steps` synchronous steps of the calculator agent, which sends `tools` on every
   call (verl's vLLM serves them with `--enable-auto-tool-choice --tool-call-parser hermes`),
   validating and saving a checkpoint at the last step;
2. `async`: two steps with async rollout on two batches of prompts (twice the batch in flight:
   step 1 carries a batch of groups over to step 2, where the data ends), a checkpoint each step;
3. `resume-async`: resumes `async` from its step-1 checkpoint under the same async settings, so
   the groups that checkpoint carried are taken back and trained in its step 2.

Each run's metrics (verl's file logger) must show every step with rollouts done and none failed,
the proxy drained, and `training/rollout_probs_diff_max` (vLLM's probabilities of the sampled
tokens against the actor's, both bf16) under `BF16_PROBS_TOLERANCE`; `async` must carry groups
over at step 1 and `resume-async` adopt them. `--dry-run` composes the configs, runs verl's
`validate_config`, and checks what the GPU runs rely on (`dry_checks`): the proxy started with
`--logprobs`, the async run's schedule carrying groups over, and the resume's schedule the one its
checkpoint was saved with (a changed one is refused); it works on a CPU machine too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

BF16_PROBS_TOLERANCE = 0.05
"""bf16 keeps 8 significant bits: each probability of actor and vLLM carries ~0.4 % relative
error per rounding, compounded over the layers; 0.05 in probability is far above that and far
below what a missed weight sync gives (the policy after a step at the check's learning rate)."""

PROJECT = "agl-gpu-check"
SCRIPT = Path(__file__).with_name("run_gpu_check.sh")
ASYNC_BATCHES = 2
"""The async run's data: two batches, all in flight from step 1, so nothing is cancelled at its end."""


def overrides(model_path: str, base_url: str, steps: int, out: str, run: str) -> list[str]:
    """A 1-GPU run: 4 prompts × 2 rollouts per step of the calculator agent; sizes only, every
    other key keeps agl's default."""
    return [
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "++actor_rollout_ref.rollout.engine_kwargs.vllm.enable_auto_tool_choice=true",
        "++actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser=hermes",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "data.train_batch_size=4",
        "data.dataloader_num_workers=0",
        "data.max_prompt_length=512",
        "data.max_response_length=128",
        "agentlightning.trace_aggregator.trajectory_max_prompt_length=512",
        "agentlightning.trace_aggregator.trajectory_max_response_length=256",
        f"agentlightning.agl_base_url={base_url}",
        "agentlightning.rollout_timeout_seconds=120",
        "agentlightning.local.agent_class=examples.calc_agent.agent:CalcAgent",
        "+agentlightning.local.env_map.QUESTION=input.question",
        "+agentlightning.local.env_map.ANSWER=input.answer",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_epochs=1",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        f"trainer.save_freq={steps}",
        f"trainer.default_local_dir={out}/checkpoints/{run}",
        f"trainer.project_name={PROJECT}",
        f"trainer.experiment_name={run}",
    ]


ASYNC = ["agentlightning.async_rollout.enabled=true", "agentlightning.async_rollout.async_train_batch_size=8"]


def runs(model: str, base_url: str, steps: int, out: str) -> dict[str, list[str]]:
    """The check's three runs, by name: their config overrides."""
    two_async_steps = [*overrides(model, base_url, ASYNC_BATCHES, out, "async"), *ASYNC, "trainer.save_freq=1"]
    return {
        "tools": [*overrides(model, base_url, steps, out, "tools"), "trainer.val_before_train=true"],
        "async": [*two_async_steps, "trainer.val_before_train=false"],
        "resume-async": [
            *two_async_steps,
            "trainer.val_before_train=false",
            f"trainer.default_local_dir={out}/checkpoints/resume-async",
            "trainer.experiment_name=resume-async",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={out}/checkpoints/async/global_step_1",
        ],
    }


def train_tasks(run: str, steps: int) -> list[dict[str, str]]:
    """A run's training prompts: the async runs' end with their second batch."""
    return tasks(4 * ASYNC_BATCHES) if run != "tools" else tasks(8 * (steps + 1))


def tasks(count: int, offset: int = 0) -> list[dict[str, str]]:
    return [{"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(offset, offset + count)]


def dry_checks(configs: dict[str, Any], steps: int) -> dict[str, Any]:
    """What the GPU runs rely on, checked without them; AssertionError names what fails."""
    from agl_train.verl_glue.schedule import schedule_for

    serve = next(line for line in SCRIPT.read_text().splitlines() if "proxy serve" in line)
    assert "--logprobs" in serve, f"{SCRIPT.name} starts its proxy without --logprobs: no rollout_probs_diff_max"
    schedules = {
        name: schedule_for(config, len(train_tasks(name, steps)) // int(config.data.train_batch_size))
        for name, config in configs.items()
    }
    carried = schedules["async"].carried(1)
    assert carried > 0, "the async run carries no group over from its step-1 checkpoint"
    saved = schedules["async"].resume_key()
    schedules["resume-async"].check_resume(saved)  # the resume's schedule is the checkpoint's
    try:
        schedules["tools"].check_resume(saved)
    except ValueError as refused:
        refusal = str(refused)
    else:
        raise AssertionError("resuming the async checkpoint under the synchronous schedule was not refused")
    return {"logprobs": True, "async_groups_carried": carried, "changed_schedule_refused": refusal}


def check_metrics(path: Path, steps: list[int], carried: dict[int, str] | None = None) -> list[str]:
    """What is wrong in a run's file-logger metrics (`{"step", "data"}` lines): the trained
    `steps` each with rollouts done and none failed, the proxy drained, the rollout's and the
    actor's probabilities within `BF16_PROBS_TOLERANCE`, and at each step of `carried` its
    metric (groups carried over, or adopted from the checkpoint) positive."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    trained = {line["step"]: line["data"] for line in lines if "training/global_step" in line["data"]}
    problems = [f"{path}: steps {sorted(trained)}, expected {steps}"] if sorted(trained) != steps else []
    for step, data in sorted(trained.items()):
        diff = data.get("training/rollout_probs_diff_max")
        checks: dict[str, Any] = {
            "rollout/n_done > 0": data.get("rollout/n_done", 0) > 0,
            "rollout/n_failed == 0": data.get("rollout/n_failed", 1) == 0,
            "rollout/proxy_drained == 1": data.get("rollout/proxy_drained") == 1.0,
            "actor/pg_loss logged": "actor/pg_loss" in data,
            f"training/rollout_probs_diff_max={diff} < {BF16_PROBS_TOLERANCE}": (
                diff is not None and diff < BF16_PROBS_TOLERANCE
            ),
        }
        if step in (carried or {}):
            name = (carried or {})[step]
            checks[f"{name} > 0"] = data.get(name, 0) > 0
        problems += [f"{path} step {step}: not {name}" for name, ok in checks.items() if not ok]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="local model directory (the tiny model)")
    parser.add_argument("--base-url", required=True, help="the running agl proxy (with its embedded store)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="/tmp/agl-gpu-check", help="the composed configs and checkpoints go here")
    parser.add_argument("--dry-run", action="store_true", help="compose and check only (no Ray, no GPU)")
    args = parser.parse_args()

    from omegaconf import OmegaConf

    from agl_train.verl_glue._verl import need_critic, need_reference_policy, validate_config
    from agl_train.verl_glue.config import compose_config
    from agl_train.verl_glue.entry import check_inputs, run_ppo

    Path(args.out).mkdir(parents=True, exist_ok=True)
    val = tasks(4, offset=1000)
    configs = {
        name: compose_config(dotlist) for name, dotlist in runs(args.model, args.base_url, args.steps, args.out).items()
    }
    for name, config in configs.items():
        check_inputs(config, train_tasks(name, args.steps), val)
        Path(args.out, f"config-{name}.yaml").write_text(OmegaConf.to_yaml(config))
        resolved = config.copy()
        OmegaConf.resolve(resolved)
        validate_config(
            resolved, use_reference_policy=need_reference_policy(resolved), use_critic=need_critic(resolved)
        )
    checked = dry_checks(configs, args.steps)
    if args.dry_run:
        print(json.dumps({"dry_run": "ok", "runs": list(configs), "val_tasks": len(val), **checked}))
        return 0
    import ray

    root = Path(os.environ.get("VERL_FILE_LOGGER_ROOT", "."))
    expected = {"tools": list(range(1, args.steps + 1)), "async": [1, 2], "resume-async": [2]}
    carried = {"async": {1: "rollout/n_groups_carried_over"}, "resume-async": {2: "resume/n_groups_adopted"}}
    problems: list[str] = []
    for name, config in configs.items():
        actor = run_ppo(config, train_tasks(name, args.steps), val)
        ray.shutdown()  # verl's named resource pools outlive a run: the next one starts a fresh cluster
        problems += check_metrics(root / PROJECT / f"{name}.jsonl", expected[name], carried.get(name))
        print(json.dumps({"run": name, "world_size": actor.world_size, "problems": len(problems)}), flush=True)
    for problem in problems:
        print("FAILED:", problem, file=sys.stderr)
    print(json.dumps({"gpu_check": "failed" if problems else "passed", "steps": args.steps}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
