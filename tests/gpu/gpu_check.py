"""A few real verl steps with agl's trainer on the tiny model: the GPU check.

Run through `tests/gpu/run_gpu_check.sh` (it starts the proxy first). The config is agl's
defaults (`agl_train/config.yaml`: GRPO, no critic, console + file logger, attention `auto`)
plus the sizes of a one-GPU run; the last step saves a checkpoint and validates, so the
schedule's last step is exercised. `--dry-run` composes the config and checks the inputs
only, which works on a CPU machine too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def overrides(model_path: str, base_url: str, steps: int, out: str) -> list[str]:
    """A 1-GPU run: 4 prompts × 2 rollouts per step, one model call per rollout (CoinAgent);
    sizes only, every other key keeps agl's default."""
    return [
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "data.train_batch_size=4",
        "data.dataloader_num_workers=0",
        "data.max_prompt_length=256",
        "data.max_response_length=64",
        "agentlightning.trace_aggregator.trajectory_max_prompt_length=256",
        "agentlightning.trace_aggregator.trajectory_max_response_length=256",
        f"agentlightning.agl_base_url={base_url}",
        "agentlightning.rollout_timeout_seconds=120",
        "agentlightning.local.agent_class=tests.train.agents:CoinAgent",
        "+agentlightning.local.env_map.QUESTION=input.question",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_epochs=1",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=true",
        f"trainer.test_freq={steps}",
        f"trainer.save_freq={steps}",
        f"trainer.default_local_dir={out}/checkpoints",
        "trainer.project_name=agl-gpu-check",
        "trainer.experiment_name=tiny",
    ]


def tasks(count: int, offset: int = 0) -> list[dict]:
    return [{"question": f"What is {i} + {i + 1}?"} for i in range(offset, offset + count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="local model directory (the tiny model)")
    parser.add_argument("--base-url", required=True, help="the running agl proxy (with its embedded store)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="/tmp/agl-gpu-check", help="the composed config and checkpoints go here")
    parser.add_argument("--dry-run", action="store_true", help="compose and check only (no Ray, no GPU)")
    args = parser.parse_args()

    from omegaconf import OmegaConf

    from agl_train.attention import resolve_attn_implementation
    from agl_train.config import compose_config
    from agl_train.entry import check_inputs, run_ppo

    config = compose_config(overrides(args.model, args.base_url, args.steps, args.out))
    train, val = tasks(4 * args.steps), tasks(4, offset=1000)
    check_inputs(config, train, val)
    resolve_attn_implementation(config)  # as run_ppo does: the composed config shows the choice
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "config.yaml").write_text(OmegaConf.to_yaml(config))
    if args.dry_run:
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        resolved = config.copy()
        OmegaConf.resolve(resolved)
        validate_config(
            resolved, use_reference_policy=need_reference_policy(resolved), use_critic=need_critic(resolved)
        )
        print(json.dumps({"dry_run": "ok", "train_tasks": len(train), "val_tasks": len(val)}))
        return 0
    run_ppo(config, train, val)
    print(json.dumps({"gpu_check": "finished", "steps": args.steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
