"""One training step's data path, in the order of docs/training.md ("One step"), for the trainer to call.

    traces = [await read_rollout(store, rid, uid=uid, reward_fillna_value=s.reward_fillna_value) ...]
    data, aggregation = build_batch(traces, s, pad_token_id, tokenizer)
    ... the trainer computes old_log_prob / ref / values on `data`, sets token_level_rewards ...
    data, metrics = prepare_update(data, s, rng=rng, adv_estimator="grpo", ...)
    ... update_actor(data) ...

`build_batch` aggregates and tensorises; `prepare_update` computes the advantage on every
row (rollout-level when enabled), then drops marked rows and caps the update count, and
finally normalises the advantage by rollout for `per_rollout_mean`.
"""

from __future__ import annotations

import random
from typing import Any, Dict, Optional, Sequence, Tuple

from ._verl import DataProto, compute_advantage
from .aggregate import Aggregation, aggregate
from .prefix_break import Detokenizer
from .settings import TrainSettings
from .traces import RolloutTrace
from .verl_batch import (
    compute_rollout_level_advantage,
    normalize_batch_advantages,
    select_update_batch,
    to_data_proto,
)


def build_batch(
    traces: Sequence[RolloutTrace],
    settings: TrainSettings,
    pad_token_id: int,
    tokenizer: Optional[Detokenizer] = None,
) -> Tuple[Optional[DataProto], Aggregation]:
    """Rows of `traces` at the configured level, as a `DataProto` (None when there are no rows).

    The aggregation (rows, prefix-break records, metrics) comes back too, for logging.
    """
    aggregation = aggregate(traces, settings.level, settings.limits, tokenizer)
    if not aggregation.rows:
        return None, aggregation
    return to_data_proto(aggregation.rows, settings.limits, pad_token_id), aggregation


def prepare_update(
    data: DataProto,
    settings: TrainSettings,
    *,
    rng: random.Random,
    adv_estimator: Any,
    **compute_advantage_kwargs: Any,
) -> Tuple[DataProto, Dict[str, float]]:
    """Advantage on all rows, then the update batch, then per-rollout normalisation.

    `data` needs `token_level_rewards` (the trainer sets it from `token_level_scores`, with
    a KL penalty if configured). `compute_advantage_kwargs` go to verl's `compute_advantage`
    (`gamma`, `lam`, `norm_adv_by_std_in_grpo`, `config`, ...). The result may have zero rows
    (fewer rows than one mini-batch); the trainer then skips the update.
    """
    if settings.enable_rollout_level_advantage:
        data = compute_rollout_level_advantage(data, adv_estimator, **compute_advantage_kwargs)
    else:
        data = compute_advantage(data, adv_estimator=adv_estimator, **compute_advantage_kwargs)
    data, metrics = select_update_batch(
        data,
        ppo_mini_batch_size=settings.ppo_mini_batch_size,
        rollout_n=settings.rollout_n,
        max_ppo_update_times=settings.max_ppo_update_times,
        rng=rng,
    )
    if settings.per_rollout_mean and len(data) > 0:
        data = normalize_batch_advantages(data)
    return data, metrics
