"""The training entry point: `run_ppo(config, train_dataset, val_dataset)` (docs/trainer.md).

```python
from agl_train.entry import run_ppo
from agl_train.config import compose_config

config = compose_config(["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
                         "agentlightning.local.agent_class=examples.calc_agent.agent:CalcAgent",
                         "agentlightning.local.env_map.QUESTION=input.question"])
run_ppo(config, train_tasks, val_tasks)
```

`run_ppo` checks its inputs before anything starts, starts Ray (unless it already runs) with
`worker_process_setup_hook` registering the `per_rollout_mean` loss in every worker process,
and runs `AglTrainer` inside a Ray actor, as verl's own `main_ppo` does.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, cast

from .attention import resolve_attn_implementation
from .config import trainer_settings
from .dataset import check_dataset

WORKER_SETUP_HOOK = "agl_train.entry.worker_process_setup_hook"


def worker_process_setup_hook() -> None:
    """Runs in every Ray worker process at start-up: registers the `per_rollout_mean` loss,
    so verl's actors find it by `policy_loss.loss_mode`."""
    from .verl_loss import register_per_rollout_loss

    register_per_rollout_loss()


def ray_init_kwargs(config: Any) -> dict[str, Any]:
    """`ray.init` arguments: verl's runtime env and `ray_kwargs.ray_init`, plus agl's setup hook."""
    from omegaconf import OmegaConf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    # Both are mappings in verl's config schema; to_container is typed for any node.
    ray_init = cast(
        dict[str, Any], OmegaConf.to_container(config.get("ray_kwargs", {}).get("ray_init", {}), resolve=True) or {}
    )
    runtime_env = cast(
        dict[str, Any],
        OmegaConf.to_container(
            OmegaConf.merge(get_ppo_ray_runtime_env(config), ray_init.pop("runtime_env", None) or {}), resolve=True
        ),
    )
    runtime_env["worker_process_setup_hook"] = WORKER_SETUP_HOOK
    return {**{k: v for k, v in ray_init.items() if v is not None}, "runtime_env": runtime_env}


def check_inputs(config: Any, train_dataset: Any, val_dataset: Any) -> tuple[list[Any], list[Any]]:
    """Validate the datasets and agl's settings; returns the datasets as lists.

    Raises TypeError / ValueError with a message naming what is wrong, before Ray starts.
    """
    train = check_dataset("train_dataset", train_dataset)
    val = check_dataset("val_dataset", val_dataset)
    trainer_settings(config)
    return train, val


def run_ppo(config: Any, train_dataset: Sequence[Any], val_dataset: Sequence[Any]) -> None:
    """Train with verl on agent rollouts of `train_dataset`, validating on `val_dataset`.

    Each dataset is a non-empty in-memory sequence of JSON-like tasks; each task becomes a
    rollout's `input`. Blocks until training ends. The actor's attention implementation is
    chosen here, in `config` (`attention.resolve_attn_implementation`: `auto` → flash-attention
    where it is installed, else SDPA).
    """
    train, val = check_inputs(config, train_dataset, val_dataset)
    resolve_attn_implementation(config)
    import ray

    worker_process_setup_hook()
    if not ray.is_initialized():
        ray.init(**ray_init_kwargs(config))
    runner = make_task_runner().options(runtime_env={"worker_process_setup_hook": WORKER_SETUP_HOOK}).remote()
    ray.get(runner.run.remote(config, train, val))


def build_trainer(config: Any, train: list[Any], val: list[Any], **worker_kwargs: Any) -> Any:
    """`AglTrainer` on a resolved `config` after verl's `validate_config`, with in-memory datasets;
    `worker_kwargs` are `RayPPOTrainer`'s worker arguments (`role_worker_mapping`, ...)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from verl.trainer.ppo.utils import create_rl_sampler, need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config
        from verl.workers.config import HFModelConfig

    from .dataset import InMemoryDataset, collate_inputs
    from .trainer import AglTrainer

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    model_config: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    train_dataset = InMemoryDataset(train, "train_dataset")
    return AglTrainer(
        config=config,
        tokenizer=model_config.tokenizer,
        processor=model_config.processor,
        train_dataset=train_dataset,
        val_dataset=InMemoryDataset(val, "val_dataset"),
        collate_fn=collate_inputs,
        train_sampler=create_rl_sampler(config.data, train_dataset),
        **worker_kwargs,
    )


def make_task_runner() -> Any:
    """The Ray actor class that builds verl's workers and runs `AglTrainer.fit()`."""
    import ray

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from verl.trainer.main_ppo_v0 import BaseTaskRunner

    class AglTaskRunner(BaseTaskRunner):
        def run(self, config: Any, train: list[Any], val: list[Any]) -> None:
            from omegaconf import OmegaConf
            from verl.trainer.ppo.utils import need_critic

            OmegaConf.resolve(config)
            resolve_attn_implementation(config)  # no-op after run_ppo; here for callers of the runner alone
            _, worker_group_cls = self.add_actor_rollout_worker(config)
            if need_critic(config):
                self.add_critic_worker(config)
            self.add_reward_model_resource_pool(config)
            trainer = build_trainer(
                config,
                train,
                val,
                role_worker_mapping=self.role_worker_mapping,
                resource_pool_manager=self.init_resource_pool_mgr(config),
                ray_worker_group_cls=worker_group_cls,
            )
            trainer.init_workers()
            trainer.fit()

    return ray.remote(num_cpus=1)(AglTaskRunner)


def main() -> None:
    """`python -m agl_train.entry [hydra overrides] data.train_files=tasks.jsonl data.val_files=val.jsonl`:
    the datasets as JSON-lines files of tasks (one JSON object per line)."""
    import json

    import hydra

    @hydra.main(config_path="pkg://agl_train", config_name="config", version_base=None)
    def _main(config: Any) -> None:
        def read(path: Any) -> list[Any]:
            paths = [path] if isinstance(path, str) else list(path)
            tasks: list[Any] = []
            for one in paths:
                with open(one, encoding="utf-8") as handle:
                    tasks += [json.loads(line) for line in handle if line.strip()]
            return tasks

        run_ppo(config, read(config.data.train_files), read(config.data.val_files))

    _main()


if __name__ == "__main__":
    main()
