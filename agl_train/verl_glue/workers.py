"""`AglWorker`: verl's `ActorRolloutRefWorker` with what agl needs set up in the worker's own process.

verl builds its workers as Ray actors in processes of their own: whatever agl sets up in the driver
(a registered loss, the attention implementation chosen for the driver's machine, the CPU platform)
is not there. Every piece is therefore done here, in the worker's constructor, however Ray was
started (`ray.init` by agl, `ray job submit`, an existing cluster):

- the `per_rollout_mean` policy loss is registered (verl looks it up by name in the worker);
- `model.override_config.attn_implementation: auto` is resolved on the worker's machine
  (flash-attention where the worker can import it, else SDPA);
- with `device="cpu"` the worker points verl at the CPU (`cpu_workers.use_cpu`: the CPU platform,
  the CPU FSDP engine, the gloo process group of the worker group's ranks).

Two methods serve the CPU weight sync and its tests: `save_rollout_weights` (every rank takes part
in the engine's `get_per_tensor_param`, rank 0 writes the safetensors file vLLM reloads) and
`param_numel` (the parameters this rank holds against the model's).

`init_worker_groups(trainer)` is `AglTrainer.init_workers`: verl's `RayPPOTrainer.init_workers`
less what agl never calls. verl's builds, besides the worker groups and the rollout replicas, a
`RewardLoopManager` (reward workers, and a reward model's servers when one is configured), an
`AgentLoopManager` (agent-loop worker actors, 8 by default) and the `LLMServerManager`'s global
load balancer: agl's agents reach vLLM through agl's proxy, which balances the replicas and
reads rewards from the agents' spans, so none of them is built. `check_worker_config` refuses
the keys that would need them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ._verl import (
    ActorRolloutRefWorker,
    CheckpointEngineManager,
    Dispatch,
    LLMServerManager,
    RayClassWithInitArgs,
    Role,
    create_colocated_worker_cls,
    need_reference_policy,
    need_reward_model,
    omega_conf_to_dataclass,
    register,
)
from .attention import MODEL_ATTN_KEY, resolve_attn_implementation
from .verl_loss import register_per_rollout_loss

WEIGHTS_FILE = "model.safetensors"


def weights_to_save(params: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """The actor's (name, tensor) pairs as CPU tensors to write, each tensor once.

    A tied weight (lm_head = embed_tokens, as in Qwen2.5's small models) comes twice as the same
    tensor, which safetensors refuses to save; vLLM ties it again from the model's config
    (`tie_word_embeddings`)."""
    tensors: dict[str, Any] = {}
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, tensor in params:
        tensor = tensor.detach().to("cpu").contiguous()
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            tensors[name] = tensor
    return tensors


class AglWorker(ActorRolloutRefWorker):
    """`ActorRolloutRefWorker(config, role, distillation_config)` plus `device`: `cuda` (verl's
    platform detection) or `cpu`."""

    def __init__(self, config: Any, role: str, distillation_config: Any = None, device: str = "cuda", **kwargs: Any):
        register_per_rollout_loss()
        if device == "cpu":
            from .cpu_workers import use_cpu

            use_cpu()
        resolve_attn_implementation(config, key=MODEL_ATTN_KEY)
        super().__init__(config, role, distillation_config, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[misc]
    def save_rollout_weights(self, directory: str) -> None:
        """Write the actor's full weights under their HF names to `directory/model.safetensors`.

        A collective: on a sharded actor every rank gathers each tensor with the others, and
        rank 0 writes the file."""
        import torch

        params, _ = self.actor.engine.get_per_tensor_param()
        if torch.distributed.get_rank() != 0:
            for _ in params:  # each full tensor is gathered with rank 0, then dropped here
                pass
            return
        from safetensors.torch import save_file

        os.makedirs(directory, exist_ok=True)
        save_file(weights_to_save(params), os.path.join(directory, WEIGHTS_FILE))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[misc]
    def param_numel(self) -> tuple[int, int]:
        """(elements of the actor's parameters this rank holds, elements of the whole model)."""
        params = list(self.actor.engine.module.parameters())
        # FSDP2's parameters are DTensors: numel() counts the whole tensor, to_local() this rank's shard.
        local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params)
        return local, sum(p.numel() for p in params)


def check_worker_config(config: Any) -> None:
    """Refuse what agl's workers would build and never use, or use wrongly; ValueError names the key."""
    from omegaconf import OmegaConf

    if need_reward_model(config):
        raise ValueError(
            "reward.reward_model.enable=true: agl's rewards come from the agents' reward spans and nothing "
            "would call verl's reward model, which would still take GPUs; set reward.reward_model.enable=false"
        )
    model = config.actor_rollout_ref.model
    lora_rank = max(int(OmegaConf.select(model, "lora.rank", default=0) or 0), int(model.get("lora_rank", 0) or 0))
    if lora_rank > 0 and not OmegaConf.select(model, "lora.merge", default=False):
        raise ValueError(
            f"actor_rollout_ref.model.lora_rank={lora_rank} without actor_rollout_ref.model.lora.merge=true: "
            "verl loads the adapter into vLLM under a LoRA name of its own and applies it only in its own "
            "generate(), while agl's agents call vLLM with the base model's name, so they would sample from "
            "the base weights as the adapter trains; set actor_rollout_ref.model.lora.merge=true (the merged "
            "weights are synced)"
        )
    workers = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    separate_ref = need_reference_policy(config) and lora_rank == 0 and not model.get("lora_adapter_path")
    if str(config.trainer.get("device", "cuda")) == "cpu" and workers > 1 and separate_ref:
        # verl shards a reference model with FSDP2's CPUOffloadPolicy(pin_memory=True)
        # (verl/workers/engine/fsdp/transformer_impl.py:462); pinning needs an accelerator.
        raise ValueError(
            "actor_rollout_ref.actor.use_kl_loss=true needs verl's reference model, which cannot be sharded "
            f"on the CPU over trainer.n_gpus_per_node={config.trainer.n_gpus_per_node} workers (FSDP2 pins its "
            "offloaded parameters); set actor_rollout_ref.actor.use_kl_loss=false, or one worker"
        )


class _ServerManager(LLMServerManager):
    """verl's vLLM replicas without verl's global load balancer (an actor routing verl's own
    generate calls): agl's proxy spreads the agents' calls over the replicas itself."""

    async def _init_global_load_balancer(self) -> None:
        self.global_load_balancer = None


def init_worker_groups(trainer: Any) -> None:
    """Build `trainer`'s actor (and reference) worker groups and its rollout replicas.

    The workers are the trainer's `role_worker_mapping` class (`AglWorker`) in verl's resource pool
    and `RayWorkerGroup`, as verl places them. With `trainer.external_rollout` (`cpu_workers.ExternalRollout`)
    the workers hold no rollout engine (role `actor`, and `ref` beside it when a reference policy is
    needed), the replicas are the external servers and the weights reach them on disk
    (`cpu_workers.DiskWeightSync`); otherwise verl starts its vLLM replicas in the actor's workers and
    pushes weights with its `CheckpointEngineManager`.
    """
    from .cpu_workers import DiskWeightSync, ExternalReplicas, cpu_precision

    config = trainer.config
    external = trainer.external_rollout
    device = "cpu" if str(config.trainer.get("device", "cuda")) == "cpu" else "cuda"
    if device == "cpu":
        cpu_precision(config.actor_rollout_ref)
    trainer.resource_pool_manager.create_resource_pool()
    actor_role = Role.ActorRolloutRef if Role.ActorRolloutRef in trainer.role_worker_mapping else Role.ActorRollout
    pool = trainer.resource_pool_manager.get_resource_pool(actor_role)

    def worker(role: str) -> Any:
        return RayClassWithInitArgs(
            cls=trainer.role_worker_mapping[actor_role],
            config=config.actor_rollout_ref,
            distillation_config=config.get("distillation"),
            role=role,
            device=device,
        )

    if external is None:
        classes = {str(actor_role): worker(str(actor_role))}
    else:
        classes = {str(actor_role): worker("actor")}
        if trainer.use_reference_policy and not trainer.ref_in_actor:
            classes[str(Role.RefPolicy)] = worker("ref")
    wg_kwargs: dict[str, Any] = {"device_name": trainer.device_name}
    timeout = config.trainer.get("ray_wait_register_center_timeout")
    if timeout is not None:
        wg_kwargs["ray_wait_register_center_timeout"] = timeout
    colocated = trainer.ray_worker_group_cls(
        resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls(class_dict=classes), **wg_kwargs
    )
    groups = colocated.spawn(prefix_set=classes.keys())
    if str(Role.RefPolicy) in groups:
        trainer.ref_policy_wg = groups[str(Role.RefPolicy)]
        trainer.ref_policy_wg.init_model()
    trainer.actor_rollout_wg = groups[str(actor_role)]
    trainer.actor_rollout_wg.init_model()
    if trainer.use_reference_policy and str(Role.RefPolicy) not in groups:
        trainer.ref_policy_wg = trainer.actor_rollout_wg  # the fused ref, or the actor without its LoRA
    if external is not None:
        trainer.llm_server_manager = ExternalReplicas(external.server_addresses)
        trainer.checkpoint_manager = DiskWeightSync(
            trainer.actor_rollout_wg, trainer.llm_server_manager, external.weights_dir
        )
        return
    trainer.llm_server_manager = _ServerManager.create(
        config=config, worker_group=trainer.actor_rollout_wg, rollout_resource_pool=pool
    )
    trainer.checkpoint_manager = CheckpointEngineManager(
        config=omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine),
        actor_wg=trainer.actor_rollout_wg,
        replicas=trainer.llm_server_manager.get_replicas(),
    )
    trainer.checkpoint_manager.sleep_replicas()


__all__ = ["WEIGHTS_FILE", "AglWorker", "check_worker_config", "init_worker_groups"]
