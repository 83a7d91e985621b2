"""Glue between agl's rows and verl's `DataProto`: build, advantage, select, normalise.

The order the trainer applies them in, each step:

1. `to_data_proto(rows, limits, pad_token_id)`;
2. `compute_rollout_level_advantage(data, adv_estimator, ...)` (or verl's own
   `compute_advantage` when `enable_rollout_level_advantage` is off), on *all* rows, so the
   group statistics see every rollout;
3. `select_update_batch(...)`: drop the rows marked for an over-long prompt, then keep
   whole mini-batches (`max_ppo_update_times`);
4. `normalize_batch_advantages(data)` when the loss mode is `per_rollout_mean`.

The math lives in `advantage`, `update_cap` and `loss`; this module only moves tensors.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ..algo.advantage import broadcast_to_rows, index_rollouts, rollout_scalars, small_group_advantage
from ..algo.loss import normalize_advantages_by_rollout
from ..algo.tensorize import rows_to_non_tensors, rows_to_tensors
from ..core.aggregate import METRIC_DROPPED_MARKED, Limits, Row
from ..core.update_cap import cap_updates
from ._verl import DataProto, compute_advantage


def to_data_proto(rows: Sequence[Row], limits: Limits, pad_token_id: int) -> DataProto:
    """The verl batch of `rows`: the tensors of `tensorize.rows_to_tensors` plus the
    non-tensors `uid`, `rollout_id`, `turn_index`."""
    return DataProto.from_dict(
        tensors=rows_to_tensors(rows, limits, pad_token_id), non_tensors=rows_to_non_tensors(rows), meta_info={}
    )


def _row_rewards(data: DataProto) -> list[float]:
    return data.batch["token_level_scores"].sum(dim=-1).tolist()


def compute_rollout_level_advantage(data: DataProto, adv_estimator: Any, **compute_advantage_kwargs: Any) -> DataProto:
    """verl's `compute_advantage` over one representative row per rollout, broadcast back.

    Needs `token_level_rewards`, `response_mask`, `uid` and `rollout_id`. Sets `advantages`
    and `returns` on every row: A[b, t] = a_{r(b)} · response_mask[b, t], where a_r is verl's
    advantage of rollout r's representative, 0 in a group of fewer than two rollouts
    (`advantage.small_group_advantage`; `meta_info["n_small_groups"]` counts those groups).
    Raises ValueError when a rollout's rows differ in uid or reward (`token_level_scores`
    summed), or when the estimator is not outcome-level.
    """
    index = index_rollouts(
        list(data.non_tensor_batch["rollout_id"]), list(data.non_tensor_batch["uid"]), _row_rewards(data)
    )
    representatives = data.select_idxs(index.representatives)
    representatives = compute_advantage(representatives, adv_estimator=adv_estimator, **compute_advantage_kwargs)
    mask = data.batch["response_mask"]
    rep_mask = representatives.batch["response_mask"]
    uids = [str(uid) for uid in representatives.non_tensor_batch["uid"]]
    advantages, small = small_group_advantage(rollout_scalars(representatives.batch["advantages"], rep_mask), uids)
    returns, _ = small_group_advantage(rollout_scalars(representatives.batch["returns"], rep_mask), uids)
    data.batch["advantages"] = broadcast_to_rows(advantages, index, mask)
    data.batch["returns"] = broadcast_to_rows(returns, index, mask)
    data.meta_info["n_small_groups"] = small
    return data


def select_update_batch(
    data: DataProto,
    *,
    ppo_mini_batch_size: int,
    rollout_n: int,
    max_ppo_update_times: int | None,
    rng: random.Random,
) -> tuple[DataProto, dict[str, float]]:
    """Drop marked rows, then keep whole mini-batches (see `update_cap`); rows keep their order.

    Metrics: `training/n_sample_dropped/marked`, `training/n_sample_dropped/same_reward`,
    `training/n_sample_dropped/random`.
    """
    marked = data.batch["is_drop_mask"]
    unmarked = (~marked).nonzero(as_tuple=True)[0].tolist()
    data = data.select_idxs(unmarked)
    cap = cap_updates(
        list(data.non_tensor_batch["uid"]),
        _row_rewards(data),
        ppo_mini_batch_size=ppo_mini_batch_size,
        rollout_n=rollout_n,
        max_ppo_update_times=max_ppo_update_times,
        rng=rng,
    )
    metrics = {METRIC_DROPPED_MARKED: float(marked.sum()), **cap.metrics}
    return data.select_idxs(cap.keep), metrics


def normalize_batch_advantages(data: DataProto) -> DataProto:
    """Divide `advantages` by (rollout's valid tokens × rows in the batch) for `per_rollout_mean`.

    Call it on the batch that goes to `update_actor`, after `select_update_batch`.
    """
    data.batch["advantages"] = normalize_advantages_by_rollout(
        data.batch["advantages"], data.batch["response_mask"], list(data.non_tensor_batch["rollout_id"])
    )
    return data
