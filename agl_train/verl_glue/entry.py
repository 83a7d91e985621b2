"""The training entry point: `run_ppo(config, train_dataset, val_dataset)` (docs/trainer.md).

```python
from agl_train.verl_glue.entry import run_ppo
from agl_train.verl_glue.config import compose_config

config = compose_config(["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
                         "agentlightning.local.agent_class=examples.calc_agent.agent:CalcAgent",
                         "agentlightning.local.env_map.QUESTION=input.question"])
run_ppo(config, train_tasks, val_tasks)
```

`run_ppo` checks its inputs before anything starts, starts Ray (unless it already runs) and runs
`AglTrainer` inside a Ray actor, as verl's own `main_ppo` does. verl's workers are
`workers.AglWorker`s, which set up agl's pieces (the `per_rollout_mean` loss, the attention
implementation, the CPU platform) in their own processes, so nothing depends on how Ray was started.

On the CPU (`trainer.device=cpu`, `trainer.n_gpus_per_node` worker processes) the rollouts run on
vLLM servers started elsewhere: `run_ppo(config, train, val, rollout=ExternalRollout(addresses,
weights_dir))` (`cpu_workers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..runner.runner_settings import advertise_gateway, ray_cluster
from .config import trainer_settings
from .dataset import check_dataset

if TYPE_CHECKING:
    from .cpu_workers import ExternalRollout

CPU_DEVICE_KEY = "trainer.device"


@dataclass(frozen=True)
class TrainedActor:
    """What `run_ppo` reports of the actor it trained: per worker process, in rank order, the
    parameter elements it held and the whole model's (equal where nothing is sharded)."""

    param_numel: list[tuple[int, int]]

    @property
    def world_size(self) -> int:
        """The actor's worker processes (FSDP's data-parallel ranks)."""
        return len(self.param_numel)


def ray_init_kwargs(config: Any) -> dict[str, Any]:
    """`ray.init` arguments: verl's runtime env and `ray_kwargs.ray_init`. On the CPU the cluster
    gets a logical CPU per worker process and one for the trainer's actor unless `num_cpus` is set
    (a small machine has fewer cores than that; the processes share them)."""
    from omegaconf import OmegaConf

    from ._verl import get_ppo_ray_runtime_env

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
    kwargs = {**{k: v for k, v in ray_init.items() if v is not None}, "runtime_env": runtime_env}
    if is_cpu(config):
        workers = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
        kwargs.setdefault("num_cpus", workers + 1)
        kwargs.setdefault("num_gpus", 0)
        kwargs.setdefault("include_dashboard", False)
    return kwargs


def is_cpu(config: Any) -> bool:
    """Whether `trainer.device` asks for the CPU."""
    return str(config.trainer.get("device", "cuda")) == "cpu"


def check_inputs(config: Any, train_dataset: Any, val_dataset: Any) -> tuple[list[Any], list[Any]]:
    """Validate the datasets and agl's settings; returns the datasets as lists.

    Raises TypeError / ValueError with a message naming what is wrong, before Ray starts.
    """
    train = check_dataset("train_dataset", train_dataset)
    val = check_dataset("val_dataset", val_dataset)
    trainer_settings(config)
    return train, val


def run_ppo(
    config: Any, train_dataset: Sequence[Any], val_dataset: Sequence[Any], rollout: ExternalRollout | None = None
) -> TrainedActor:
    """Train with verl on agent rollouts of `train_dataset`, validating on `val_dataset`.

    Each dataset is a non-empty in-memory sequence of JSON-like tasks; each task becomes a
    rollout's `input`. Blocks until training ends; returns what the actor's workers held
    (`TrainedActor`: the world size, the shards). `rollout` replaces the vLLM replicas verl would
    start by servers started elsewhere; the CPU needs it (`trainer.device=cpu`).
    """
    train, val = check_inputs(config, train_dataset, val_dataset)
    if is_cpu(config) and rollout is None:
        raise ValueError(
            f"{CPU_DEVICE_KEY}=cpu: verl cannot start its vLLM servers on the CPU; start vLLM (dev mode) "
            "and pass run_ppo(..., rollout=agl_train.verl_glue.cpu_workers.ExternalRollout(addresses, weights_dir))"
        )
    import ray

    if not ray.is_initialized():
        ray.init(**ray_init_kwargs(config))
    advertise_gateway(config, *ray_cluster())
    runner = make_task_runner().remote()
    return TrainedActor(ray.get(runner.run.remote(config, train, val, rollout)))


def build_trainer(config: Any, train: list[Any], val: list[Any], **worker_kwargs: Any) -> Any:
    """`AglTrainer` on a resolved `config` after verl's `validate_config`, with in-memory datasets;
    `worker_kwargs` are `RayPPOTrainer`'s worker arguments (`role_worker_mapping`, ...)."""
    from ._verl import (
        HFModelConfig,
        create_rl_sampler,
        need_critic,
        need_reference_policy,
        omega_conf_to_dataclass,
        validate_config,
    )
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

    from ._verl import BaseTaskRunner, Role

    class AglTaskRunner(BaseTaskRunner):
        def run(
            self, config: Any, train: list[Any], val: list[Any], rollout: ExternalRollout | None = None
        ) -> list[tuple[int, int]]:
            from omegaconf import OmegaConf

            from ._verl import RayWorkerGroup
            from .cpu_workers import CpuResourcePoolManager
            from .workers import AglWorker

            OmegaConf.resolve(config)
            if is_cpu(config):
                from ._verl import platform_manager
                from .cpu_workers import CpuPlatform

                platform_manager.set_platform(CpuPlatform())  # verl's trainer code asks the platform too
            self.add_actor_rollout_worker(config)
            # verl's mapping names its own worker class; agl's sets itself up in each worker process.
            for role in (Role.ActorRollout, Role.ActorRolloutRef):
                if role in self.role_worker_mapping:
                    self.role_worker_mapping[role] = ray.remote(AglWorker)
            self.add_reward_model_resource_pool(config)
            pools = self.init_resource_pool_mgr(config)
            if is_cpu(config):
                pools = CpuResourcePoolManager(resource_pool_spec=pools.resource_pool_spec, mapping=pools.mapping)
            trainer = build_trainer(
                config,
                train,
                val,
                role_worker_mapping=self.role_worker_mapping,
                resource_pool_manager=pools,
                ray_worker_group_cls=RayWorkerGroup,
                rollout=rollout,
            )
            trainer.init_workers()
            trainer.fit()
            return [tuple(numel) for numel in trainer.actor_rollout_wg.param_numel()]

    return ray.remote(num_cpus=1)(AglTaskRunner)


def main() -> None:
    """`python -m agl_train.verl_glue.entry [hydra overrides] data.train_files=tasks.jsonl data.val_files=val.jsonl`:
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
