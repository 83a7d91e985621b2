"""Rollout-level advantage (`algorithm.enable_rollout_level_advantage`, on in agl's config).

After aggregation one rollout may own any number of rows. Computing GRPO over rows would
let a rollout that was split into three rows count three times in its group's mean and
standard deviation. Instead:

1. take one representative row per rollout (`index_rollouts`);
2. compute verl's standard advantage on the representatives only (the glue in
   `verl_batch.compute_rollout_level_advantage` calls verl's `compute_advantage`);
3. read each representative's scalar advantage (`rollout_scalars`), set it to 0 in groups
   with fewer than two trainable rollouts (`small_group_advantage`), and broadcast it to all
   rows of its rollout through `response_mask` (`broadcast_to_rows`):
   A[b, t] = a_{r(b)} · response_mask[b, t].

Rows of one rollout must share one `uid` and one reward; anything else is a bug upstream
and raises `ValueError`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RolloutIndex:
    """Which row represents each rollout, and which rollout each row belongs to.

    `representatives[k]` is the first row of the k-th rollout (rollouts in order of first
    appearance); `row_to_rollout[b] = k` for every row b of that rollout.
    """

    rollout_ids: list[str]
    representatives: list[int]
    row_to_rollout: torch.Tensor


def index_rollouts(rollout_ids: Sequence[str], uids: Sequence[str], rewards: Sequence[float]) -> RolloutIndex:
    """Group rows by rollout, checking that each rollout's rows share one uid and one reward."""
    if not (len(rollout_ids) == len(uids) == len(rewards)):
        raise ValueError("rollout_ids, uids and rewards must have one entry per row")
    position: dict[str, int] = {}
    representatives: list[int] = []
    row_to_rollout: list[int] = []
    for row, rollout_id in enumerate(rollout_ids):
        k = position.get(rollout_id)
        if k is None:
            k = position[rollout_id] = len(representatives)
            representatives.append(row)
        else:
            first = representatives[k]
            if uids[row] != uids[first]:
                raise ValueError(
                    f"rollout {rollout_id!r} has rows in two groups (uid {uids[first]!r} and {uids[row]!r})"
                )
            if rewards[row] != rewards[first]:
                raise ValueError(
                    f"rollout {rollout_id!r} has rows with different rewards ({rewards[first]} and {rewards[row]})"
                )
        row_to_rollout.append(k)
    return RolloutIndex(
        rollout_ids=list(position),
        representatives=representatives,
        row_to_rollout=torch.tensor(row_to_rollout, dtype=torch.long),
    )


def rollout_scalars(advantages: torch.Tensor, response_mask: torch.Tensor, atol: float = 1e-5) -> torch.Tensor:
    """The scalar advantage of each representative row, shape `[n]` from `[n, R]` tensors.

    a_k = advantages[k, t] at any t with response_mask[k, t] = 1. An estimator whose
    advantage varies along a row (GAE) has no rollout-level scalar: that raises ValueError.
    """
    mask = response_mask.bool()
    if not bool(mask.any(dim=-1).all()):
        raise ValueError("every representative row needs at least one response token with mask 1")
    first = mask.float().argmax(dim=-1)
    scalars = advantages[torch.arange(advantages.shape[0]), first]
    spread = ((advantages - scalars.unsqueeze(-1)).abs() * mask).amax(dim=-1)
    if bool((spread > atol).any()):
        raise ValueError(
            "rollout-level advantage needs an outcome estimator (one scalar per row, e.g. grpo); "
            "this estimator's advantage varies along the response"
        )
    return scalars


MIN_GROUP = 2
"""The fewest trainable rollouts a group needs for a group-relative advantage."""


def small_group_advantage(scalars: torch.Tensor, uids: Sequence[str]) -> tuple[torch.Tensor, int]:
    """The rollouts' advantages with those of small groups set to zero, and how many groups were small.

    With G(k) = {j : uids[j] = uids[k]} the trainable rollouts of rollout k's group,

        a'_k = a_k   if |G(k)| >= MIN_GROUP
        a'_k = 0     otherwise.

    Only succeeded rollouts are trained, so a group whose other rollouts failed can reach the
    advantage with one rollout; GRPO's statistics of a group of one (mean 0, std 1 in verl) would
    give it its raw reward as advantage, whatever its peers did. Zero says what the step knows:
    nothing to compare it with (docs/training.md, Small groups).
    """
    if len(uids) != scalars.shape[0]:
        raise ValueError(f"one uid per rollout: {len(uids)} uids for {scalars.shape[0]} advantages")
    sizes = Counter(uids)
    keep = torch.tensor([sizes[uid] >= MIN_GROUP for uid in uids], dtype=torch.bool)
    small = sum(1 for size in sizes.values() if size < MIN_GROUP)
    return torch.where(keep.to(scalars.device), scalars, torch.zeros_like(scalars)), small


def broadcast_to_rows(scalars: torch.Tensor, index: RolloutIndex, response_mask: torch.Tensor) -> torch.Tensor:
    """A[b, t] = scalars[row_to_rollout[b]] · response_mask[b, t], shape `[B, R]`."""
    return scalars[index.row_to_rollout].unsqueeze(-1) * response_mask.to(scalars.dtype)
