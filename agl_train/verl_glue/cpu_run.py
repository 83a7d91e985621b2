"""`AglTrainer.fit()` in this process on the CPU, no Ray: `run_ppo_on_cpu`.

One `AglWorker` built here (`LocalWorkerGroup`, world size 1, the model unwrapped) stands in for
verl's worker groups, with the CPU replacements of `cpu_workers` (the vLLM servers started
elsewhere as the rollout replicas, the weight sync through a directory). It starts in seconds
instead of the half minute or more of a Ray cluster and its worker processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from ._verl import ResourcePoolManager, Role
from .cpu_workers import DiskWeightSync, ExternalReplicas, cpu_precision, use_cpu
from .entry import build_trainer, check_inputs
from .verl_loss import register_per_rollout_loss
from .workers import AglWorker


class LocalWorkerGroup:
    """Stands in for verl's `RayWorkerGroup`: the same `ActorRolloutRefWorker`, built in this
    process (world size 1), called directly instead of through Ray's dispatch and collect."""

    def __init__(self, actor_rollout_ref_config: Any, role: str) -> None:
        cpu_precision(actor_rollout_ref_config)
        self.worker = AglWorker(actor_rollout_ref_config, role=role, device="cpu")
        self.worker.init_model()
        self.world_size = 1
        # verl's trainer caches each role's data-parallel ranks here (`_get_dp_size`, used by `balance_batch`).
        self._dispatch_info: dict[str, list[int]] = {}

    def _query_dispatch_info(self, role: str) -> list[int]:
        """The data-parallel rank of each worker: one worker, rank 0."""
        return [0]

    @property
    def model(self) -> torch.nn.Module:
        """The trained HF model (the actor's, or the reference's for a `ref` group)."""
        training_worker = self.worker.actor if self.worker.actor is not None else self.worker.ref
        return training_worker.engine.module

    def compute_log_prob(self, data: Any) -> Any:
        return self.worker.compute_log_prob(data)

    def compute_ref_log_prob(self, data: Any) -> Any:
        return self.worker.compute_ref_log_prob(data)

    def update_actor(self, data: Any) -> Any:
        return self.worker.update_actor(data)

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.worker.save_checkpoint(*args, **kwargs)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.worker.load_checkpoint(*args, **kwargs)

    def save_rollout_weights(self, directory: str) -> None:
        """The actor's weights to `directory/model.safetensors` (`AglWorker.save_rollout_weights`)."""
        self.worker.save_rollout_weights(directory)


def init_cpu_workers(trainer: Any, server_addresses: Sequence[str], weights_dir: Path) -> None:
    """What `RayPPOTrainer.init_workers()` sets up, in this process on the CPU: the actor (and the
    reference policy when the config needs one) as local workers, the vLLM servers at
    `server_addresses` as the rollout replicas, and the weight sync to them through `weights_dir`."""
    use_cpu()
    actor = LocalWorkerGroup(trainer.config.actor_rollout_ref, role="actor")
    trainer.actor_rollout_wg = actor
    if trainer.use_reference_policy:
        trainer.ref_policy_wg = LocalWorkerGroup(trainer.config.actor_rollout_ref, role="ref")
    trainer.llm_server_manager = ExternalReplicas(server_addresses)
    trainer.checkpoint_manager = DiskWeightSync(actor, trainer.llm_server_manager, weights_dir)


def run_ppo_on_cpu(
    config: Any,
    train_dataset: Sequence[Any],
    val_dataset: Sequence[Any],
    server_addresses: Sequence[str],
    weights_dir: Path,
) -> Any:
    """Train like `agl_train.verl_glue.entry.run_ppo`, in this process on the CPU, against the vLLM servers at
    `server_addresses`; returns the trainer after `fit()` (its `actor_rollout_wg.model` is the
    trained model)."""
    train, val = check_inputs(config, train_dataset, val_dataset)
    register_per_rollout_loss()
    config = config.copy()
    OmegaConf.resolve(config)
    trainer = build_trainer(
        config,
        train,
        val,
        # Only read by verl's constructor here: init_cpu_workers builds the workers itself.
        role_worker_mapping={Role.ActorRollout: LocalWorkerGroup},
        resource_pool_manager=ResourcePoolManager(
            resource_pool_spec={"global_pool": [1]}, mapping={Role.ActorRollout: "global_pool"}
        ),
    )
    init_cpu_workers(trainer, server_addresses, weights_dir)
    trainer.fit()
    return trainer


__all__ = ["LocalWorkerGroup", "init_cpu_workers", "run_ppo_on_cpu"]
