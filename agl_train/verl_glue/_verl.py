"""verl's pieces that agl_train uses, imported in one place.

verl warns at import about optional engines (megatron, torchtitan, ...) that agl never
uses; those warnings are silenced here so that `-W error` test runs can import it.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from verl import DataProto
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.plugin.platform import platform_manager
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, ResourcePoolManager
    from verl.single_controller.ray.base import create_colocated_worker_cls
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
    from verl.trainer.main_ppo_v0 import BaseTaskRunner
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.core_algos import AdvantageEstimator, agg_loss, get_policy_loss_fn, register_policy_loss
    from verl.trainer.ppo.metric_utils import (
        compute_data_metrics,
        compute_throughout_metrics,
        compute_timing_metrics,
    )
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, Role, compute_advantage
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
    from verl.trainer.ppo.utils import create_rl_sampler, need_critic, need_reference_policy, need_reward_model
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.debug import marked_timer
    from verl.utils.debug.metrics import calculate_debug_metrics
    from verl.utils.metric import reduce_metrics
    from verl.utils.tracking import Tracking
    from verl.workers.config import HFModelConfig
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.rollout.llm_server import LLMServerManager

__all__ = [
    "ActorRolloutRefWorker",
    "AdvantageEstimator",
    "BaseTaskRunner",
    "CheckpointEngineManager",
    "DataProto",
    "Dispatch",
    "EngineRegistry",
    "FSDPEngineWithLMHead",
    "HFModelConfig",
    "LLMServerManager",
    "PlatformBase",
    "RayClassWithInitArgs",
    "RayPPOTrainer",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolManager",
    "Role",
    "Tracking",
    "agg_loss",
    "calculate_debug_metrics",
    "compute_advantage",
    "compute_data_metrics",
    "compute_rollout_correction_and_add_to_batch",
    "compute_throughout_metrics",
    "compute_timing_metrics",
    "core_algos",
    "create_colocated_worker_cls",
    "create_rl_sampler",
    "get_policy_loss_fn",
    "get_ppo_ray_runtime_env",
    "marked_timer",
    "need_critic",
    "need_reference_policy",
    "need_reward_model",
    "omega_conf_to_dataclass",
    "platform_manager",
    "reduce_metrics",
    "register",
    "register_policy_loss",
    "validate_config",
]
