"""The `per_rollout_mean` policy loss, registered in verl's policy-loss registry.

verl looks losses up by `actor_rollout_ref.actor.policy_loss.loss_mode` in the worker that
trains; agl's worker class (`workers.AglWorker`) calls `register_per_rollout_loss()` in its
constructor, so every worker process has it however Ray was started. The math is
`loss.per_rollout_mean_loss`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..algo.loss import LOSS_MODE, per_rollout_mean_loss
from ._verl import core_algos, register_policy_loss


def compute_policy_loss_per_rollout_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's policy-loss signature around `loss.per_rollout_mean_loss`.

    Clip ratios come from the actor config (`clip_ratio_low` / `clip_ratio_high`, falling back
    to `clip_ratio`; `clip_ratio_c`, default 3.0), the dp size from
    `config.global_batch_info["dp_size"]` (1 when absent). `loss_agg_mode` is ignored: this
    mode always aggregates as a masked sum, its averaging is done by the advantage normalisation.
    """
    if config is None:
        raise ValueError("per_rollout_mean needs the actor config (clip ratios)")
    clip_ratio = config.clip_ratio
    clip_low = config.clip_ratio_low if config.clip_ratio_low is not None else clip_ratio
    clip_high = config.clip_ratio_high if config.clip_ratio_high is not None else clip_ratio
    batch_info = getattr(config, "global_batch_info", None) or {}
    return per_rollout_mean_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=config.get("clip_ratio_c", 3.0),
        rollout_is_weights=rollout_is_weights,
        dp_size=int(batch_info.get("dp_size", 1)),
    )


def register_per_rollout_loss() -> None:
    """Register `per_rollout_mean` in verl's registry; safe to call again in the same process.

    verl's own `register_policy_loss` silently replaces an entry; here a *different* function
    already registered under the name is an error rather than a silent override.
    """
    existing = core_algos.POLICY_LOSS_REGISTRY.get(LOSS_MODE)
    if existing is compute_policy_loss_per_rollout_mean:
        return
    if existing is not None:
        raise ValueError(f"policy loss {LOSS_MODE!r} is already registered to {existing!r}")
    register_policy_loss(LOSS_MODE)(compute_policy_loss_per_rollout_mean)
