"""The `per_rollout_mean` policy loss and its advantage normalisation (docs/training.md).

A rollout may be split into many rows; averaging the loss per row or per token would give
it weight in proportion to how many rows or tokens it produced. `per_rollout_mean` gives
every rollout the same total weight instead, in two steps:

1. `normalize_advantages_by_rollout` (on the driver, on the batch that goes to the update):
   Â[b, t] = A[b, t] / (T_{r(b)} · N),
   with T_r the valid response tokens (response_mask = 1) of all rows of rollout r in the
   batch and N the number of rows in the batch. A rollout's total weight is then
   Σ_{b∈r} Σ_t Â[b, t] = a_r · T_r / (T_r · N) = a_r / N, whatever its row count.
2. `per_rollout_mean_loss` (in the actor): verl's clipped PPO objective with dual clip
   (Schulman et al. 2017, https://arxiv.org/abs/1707.06347; Ye et al. 2019,
   https://arxiv.org/abs/1912.09729) on Â, optionally weighted by rollout importance-
   sampling weights, aggregated as a masked *sum* × dp size (the normalisation already did
   the averaging; × dp size undoes the data-parallel gradient mean).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

LOSS_MODE = "per_rollout_mean"


def normalize_advantages_by_rollout(
    advantages: torch.Tensor, response_mask: torch.Tensor, rollout_ids: Sequence[str]
) -> torch.Tensor:
    """Â[b, t] = A[b, t] / (T_{r(b)} · N) for `[B, R]` advantages (see the module docstring).

    A rollout whose rows have no valid token keeps advantage 0 (nothing of it is trained).
    """
    n_rows = advantages.shape[0]
    if len(rollout_ids) != n_rows:
        raise ValueError(f"{len(rollout_ids)} rollout ids for {n_rows} rows")
    if n_rows == 0:
        return advantages.clone()
    codes: dict[str, int] = {}
    row_rollout = torch.tensor([codes.setdefault(r, len(codes)) for r in rollout_ids], dtype=torch.long)
    row_tokens = response_mask.to(torch.float64).sum(dim=-1)
    rollout_tokens = torch.zeros(len(codes), dtype=torch.float64).index_add_(0, row_rollout, row_tokens)
    denominator = rollout_tokens[row_rollout] * n_rows  # T_{r(b)} · N
    scale = torch.where(denominator > 0, 1.0 / denominator.clamp(min=1.0), torch.zeros_like(denominator))
    return advantages * scale.to(advantages.dtype).unsqueeze(-1)


def clipped_policy_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token dual-clip PPO losses, `[B, R]`, with the two clip indicators.

    ρ = exp(clamp(log π − log π_old, −20, 20))
    L1 = max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high))
    L  = min(L1, −A·c) where A < 0, else L1           (dual clip, c = clip_ratio_c > 1)
    Returns (L, [−A·clip(ρ) > −A·ρ], [A < 0 and L1 > −A·c]).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    losses_unclipped = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    losses_ppo = torch.maximum(losses_unclipped, losses_clipped)
    losses_dual = -advantages * clip_ratio_c
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(losses_ppo, losses_dual), losses_ppo)
    return losses, losses_clipped > losses_unclipped, negative & (losses_ppo > losses_dual)


def per_rollout_mean_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
    dp_size: int = 1,
) -> tuple[torch.Tensor, dict[str, float]]:
    """loss = dp_size · Σ_{b,t} m[b, t] · w[b, t] · L[b, t], with L from `clipped_policy_losses`.

    `advantages` must already be normalised by `normalize_advantages_by_rollout`; `w` are the
    optional rollout importance-sampling weights (1 when None), detached, as verl's
    `algorithm.rollout_correction` makes them from log r = log π_old − log π_rollout (the actor's
    old log-probs against the sampling ones): per token w = min(exp(log r), C), per sequence
    w = min(exp(Σ_t log r), C) (truncated IS, C = `rollout_is_threshold`), or w = exp(log r) inside
    [lower, upper] and 0 outside (`"lower_upper"`). All tensors are `[B, R]`.
    Returns the scalar loss and verl's metrics `actor/pg_clipfrac`, `actor/ppo_kl`,
    `actor/pg_clipfrac_lower`.
    """
    losses, clipped, dual_clipped = clipped_policy_losses(
        old_log_prob, log_prob, advantages, clip_ratio_low, clip_ratio_high, clip_ratio_c
    )
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    mask = response_mask.to(losses.dtype)
    loss = (losses * mask).sum() * dp_size

    n_tokens = mask.sum().clamp(min=1.0)
    log_prob = log_prob.detach()  # the metrics are plain numbers; float() of a tensor in the graph warns
    metrics = {
        "actor/pg_clipfrac": float((clipped.to(mask.dtype) * mask).sum() / n_tokens),
        "actor/ppo_kl": float(((old_log_prob - log_prob).clamp(-20.0, 20.0) * mask).sum() / n_tokens),
        "actor/pg_clipfrac_lower": float((dual_clipped.to(mask.dtype) * mask).sum() / n_tokens),
    }
    return loss, metrics
