"""verl's pieces that agl_train uses, imported in one place.

verl warns at import about optional engines (megatron, torchtitan, ...) that agl never
uses; those warnings are silenced here so that `-W error` test runs can import it.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.core_algos import AdvantageEstimator, agg_loss, get_policy_loss_fn, register_policy_loss
    from verl.trainer.ppo.ray_trainer import compute_advantage

__all__ = [
    "AdvantageEstimator",
    "DataProto",
    "agg_loss",
    "compute_advantage",
    "core_algos",
    "get_policy_loss_fn",
    "register_policy_loss",
]
