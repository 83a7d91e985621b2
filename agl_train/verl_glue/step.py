"""One training step's data path, from new prompts to the batch that goes to the actor update
(docs/training.md, "One step").

`rollout_step` runs it on the trainer's background loop, verl-free apart from `DataProto`
(the tests run it on the CPU with the real store, proxy and a tiny vLLM): enqueue `n`
rollouts per prompt → runners execute them → wait (`rollout_timeout_seconds`) → read spans →
rows (trace aggregator) → advantage (rollout-level) → update cap → per-rollout normalisation.
Failed and timed-out rollouts are dropped from the batch and counted; so are the rollouts of a
step whose spans the proxy had not all exported in time (`SPAN_EXPORT_WAIT_S`), and the rows
of rollouts whose calls did not run with the sampling parameters the actor assumes
(`off_sampling`).

Its second half is two functions a trainer can also call on traces it read itself:

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

import asyncio
import logging
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agl_store.base import LightningStore
from agl_store.span_wire import collector_paused

from ..algo.staleness import mask_stale_tokens, staleness_metrics
from ..algo.tensorize import SAMPLING_VERSIONS
from ..core.aggregate import Aggregation, aggregate
from ..core.prefix_break import Detokenizer
from ..core.traces import RolloutTrace, read_rollout
from ..runner.groups import Collected, Group, GroupTracker
from ..runner.proxy_control import ProxyControl
from ._verl import DataProto, compute_advantage
from .config import TrainSettings
from .verl_batch import (
    compute_rollout_level_advantage,
    normalize_batch_advantages,
    select_update_batch,
    to_data_proto,
)

logger = logging.getLogger(__name__)

WAIT_GRACE_S = 30.0
"""Extra wait past the rollout timeout: the runner kills at the timeout, then records the outcome."""
SPAN_EXPORT_WAIT_S = 60.0
"""How long a step waits for the proxy to write its buffered spans before it drops the step's
rollouts (a rollout read before all its spans are written would train on a partial trace)."""


@dataclass(frozen=True)
class StepData:
    """What one step's rollouts produced: the update batch (None when no row survived), the
    metrics of the step, and the groups it trained on."""

    data: DataProto | None
    metrics: dict[str, float]
    collected: Collected


def _token_metrics(data: DataProto | None) -> dict[str, float]:
    if data is None or len(data) == 0:
        return {"training/n_update_rows": 0.0, "training/n_response_tokens": 0.0, "training/n_tokens": 0.0}
    return {
        "training/n_update_rows": float(len(data)),
        "training/n_response_tokens": float(data.batch["response_mask"].sum()),
        "training/n_tokens": float(data.batch["attention_mask"].sum()),
    }


READS_IN_FLIGHT = 8
"""Rollouts read at once: the store serves one while the trainer decodes another."""


async def read_succeeded(
    store: LightningStore, groups: Sequence[Group], reward_fillna_value: float, *, in_flight: int = READS_IN_FLIGHT
) -> list[RolloutTrace]:
    """The traces of the succeeded rollouts of `groups`, in group order, each under its group's uid
    (`in_flight` reads at a time).

    The garbage collector is paused while the batch is read (`span_wire.collector_paused`):
    every span, call and trace read survives until the step ends, so each collection the
    read's allocations would start walks, in vain, what was read before (and the trainer's
    heap). One collection after the read sees the batch once.
    """
    slots = asyncio.Semaphore(in_flight)

    async def read(rollout_id: str, uid: str) -> RolloutTrace:
        async with slots:
            return await read_rollout(store, rollout_id, uid=uid, reward_fillna_value=reward_fillna_value)

    with collector_paused():
        return list(
            await asyncio.gather(*(read(rollout_id, group.uid) for group in groups for rollout_id in group.succeeded()))
        )


async def rollout_step(
    store: LightningStore,
    tracker: GroupTracker,
    inputs: Sequence[Any],
    settings: TrainSettings,
    *,
    rollout_timeout_s: float,
    pad_token_id: int,
    rng: random.Random,
    adv_estimator: Any = "grpo",
    groups_to_train: int | None = None,
    resources_id: str | None = None,
    proxy: ProxyControl | None = None,
    tokenizer: Detokenizer | None = None,
    sampling: Mapping[str, Any] | None = None,
    span_export_wait_s: float = SPAN_EXPORT_WAIT_S,
    trained_version: int | None = None,
    **compute_advantage_kwargs: Any,
) -> StepData:
    """One step's data path, from new prompts to the batch that goes to the actor update.

    `inputs` are enqueued as new groups (`tracker.n` rollouts each, under `resources_id`);
    the step then trains on the first `groups_to_train` groups to complete (default: as many
    as were submitted; in async mode `data.train_batch_size` while more stay in flight).
    Without async rollout, groups still unfinished after `rollout_timeout_s` (+ a grace) are
    cancelled and counted as timed out. `proxy`, when given, is waited on (up to
    `span_export_wait_s`) until its span buffer is written; past that the step's rollouts are
    dropped (`rollout/n_dropped_spans_not_exported`, one warning). `sampling`, when given, is
    what every trained call must have run with (see `off_sampling`); the rows of rollouts
    with a call that did not are dropped from the update after the advantage
    (`rollout/n_calls_off_sampling`, `training/n_rows_off_sampling`, one warning).
    `trained_version`, when given, is the weight version the update trains (the one the step's
    rollouts were published under): the update's staleness is measured against it and, with
    `settings.max_token_staleness`, its stale tokens masked (`off_policy`).
    `compute_advantage_kwargs` go to verl's `compute_advantage` (e.g. `norm_adv_by_std_in_grpo`).
    """
    started = time.monotonic()
    timeout_s = rollout_timeout_s + WAIT_GRACE_S
    collected, metrics = await _collect(tracker, inputs, groups_to_train, resources_id, timeout_s)
    groups, dropped = await _groups_with_spans_exported(collected.groups, proxy, span_export_wait_s)
    metrics.update(dropped)
    traces = await read_succeeded(store, groups, settings.reward_fillna_value)
    data, aggregation = build_batch(traces, settings, pad_token_id, tokenizer)
    metrics.update({key: float(value) for key, value in aggregation.metrics.items()})
    if sampling is not None:
        metrics.update(_drop_off_sampling(traces, data, sampling))
    metrics.update(_reward_metrics(traces))
    if data is not None:
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        data, cap_metrics = prepare_update(
            data, settings, rng=rng, adv_estimator=adv_estimator, **compute_advantage_kwargs
        )
        metrics.update(cap_metrics)
        data, off_policy_metrics = off_policy(data, trained_version, settings.max_token_staleness)
        metrics.update(off_policy_metrics)
    metrics.update(_token_metrics(data))
    metrics["timing_s/agl_rollout_step"] = time.monotonic() - started
    return StepData(data=data if data is not None and len(data) > 0 else None, metrics=metrics, collected=collected)


async def _collect(
    tracker: GroupTracker,
    inputs: Sequence[Any],
    groups_to_train: int | None,
    resources_id: str | None,
    timeout_s: float,
) -> tuple[Collected, dict[str, float]]:
    """Enqueue `inputs` as new groups, wait up to `timeout_s` for `groups_to_train` groups (default:
    as many as were submitted), and count how the rollouts ended. Without async rollout
    (`groups_to_train` None) the groups still in flight then are cancelled as timed out."""
    if inputs:
        await tracker.submit(inputs, resources_id=resources_id)
    count = groups_to_train if groups_to_train is not None else len(inputs)
    collected = await tracker.collect(count, timeout_s=timeout_s)
    metrics = dict(collected.metrics)
    if groups_to_train is None and tracker.in_flight:
        abandoned = await tracker.abandon()
        metrics["rollout/n_timed_out"] += abandoned["timeout"]
        metrics["rollout/n_abandoned"] = float(abandoned["timeout"])
    return collected, metrics


async def _groups_with_spans_exported(
    groups: list[Group], proxy: ProxyControl | None, wait_s: float
) -> tuple[list[Group], dict[str, float]]:
    """`groups`, or none of them when `proxy` has not written its span buffer within `wait_s`."""
    if proxy is None or await proxy.wait_spans_exported(timeout_s=wait_s):
        return groups, {"rollout/n_dropped_spans_not_exported": 0.0}
    # The buffer is the proxy's, not a rollout's: any of the step's rollouts may miss spans.
    dropped = sum(len(group.succeeded()) for group in groups)
    logger.warning(
        "the proxy had not written all its spans after %g s: the %d rollouts of this step are dropped "
        "(a partial trace would be trained as if it were the whole rollout)",
        wait_s,
        dropped,
    )
    return [], {"rollout/n_dropped_spans_not_exported": float(dropped)}


def _drop_off_sampling(
    traces: Sequence[RolloutTrace], data: DataProto | None, sampling: Mapping[str, Any]
) -> dict[str, float]:
    """Mark for dropping the rows of rollouts with a call that did not run with `sampling`."""
    off = off_sampling(traces, sampling)
    metrics = {"rollout/n_calls_off_sampling": float(sum(off.values())), "training/n_rows_off_sampling": 0.0}
    if off:
        logger.warning(
            "%d calls of %d rollouts did not run with the sampling the actor assumes (%s): their rows are not trained",
            sum(off.values()),
            len(off),
            dict(sampling),
        )
        if data is not None:
            metrics["training/n_rows_off_sampling"] = float(mark_rollouts_dropped(data, set(off)))
    return metrics


def _reward_metrics(traces: Sequence[RolloutTrace]) -> dict[str, float]:
    if not traces:
        return {}
    rewards = [trace.reward for trace in traces]
    return {
        "rollout/reward_mean": float(np.mean(rewards)),
        "rollout/reward_max": float(np.max(rewards)),
        "rollout/reward_min": float(np.min(rewards)),
    }


def off_sampling(traces: Sequence[RolloutTrace], sampling: Mapping[str, Any]) -> dict[str, int]:
    """Per rollout id, its calls that did not run with `sampling` (`LLMCall.sampling`: what the
    proxy sent the backend): temperature, top_p and top_k must be equal (the actor's log-probs
    assume them), `max_tokens` at most the cap (a shorter answer changes no ratio). A call that
    does not say what it ran with counts too. Rollouts whose calls all match are left out."""
    off: dict[str, int] = {}
    for trace in traces:
        count = sum(not _same_sampling(call.sampling, sampling) for call in trace.calls)
        if count:
            off[trace.rollout_id] = count
    return off


def _same_sampling(used: Mapping[str, Any] | None, expected: Mapping[str, Any]) -> bool:
    if used is None:
        return False
    for key, want in expected.items():
        got = used.get(key)
        if key == "max_tokens":
            if not isinstance(got, int) or got > want:
                return False
        elif isinstance(want, float) or isinstance(got, float):
            if not isinstance(got, (int, float)) or not math.isclose(float(got), float(want), abs_tol=1e-6):
                return False
        elif got != want:
            return False
    return True


def mark_rollouts_dropped(data: DataProto, rollout_ids: set[str]) -> int:
    """Mark the rows of `rollout_ids` for dropping (`is_drop_mask`: they still count in their
    group's advantage, then `select_update_batch` leaves them out); returns how many."""
    rows = torch.from_numpy(np.isin(data.non_tensor_batch["rollout_id"], list(rollout_ids)))
    data.batch["is_drop_mask"] = data.batch["is_drop_mask"] | rows.to(data.batch["is_drop_mask"].device)
    return int(rows.sum())


def build_batch(
    traces: Sequence[RolloutTrace],
    settings: TrainSettings,
    pad_token_id: int,
    tokenizer: Detokenizer | None = None,
) -> tuple[DataProto | None, Aggregation]:
    """Rows of `traces` at the configured level, as a `DataProto` (None when there are no rows).

    The aggregation (rows, prefix-break records, metrics) comes back too, for logging.
    """
    aggregation = aggregate(traces, settings.level, settings.limits, tokenizer, superseded=settings.superseded)
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
) -> tuple[DataProto, dict[str, float]]:
    """Advantage on all rows, then the update batch, then per-rollout normalisation.

    `data` needs `token_level_rewards` (the trainer sets it from `token_level_scores`, with
    a KL penalty if configured). `compute_advantage_kwargs` go to verl's `compute_advantage`
    (`gamma`, `lam`, `norm_adv_by_std_in_grpo`, `config`, ...). The result may have zero rows
    (fewer rows than one mini-batch); the trainer then skips the update.
    """
    if settings.enable_rollout_level_advantage:
        data = compute_rollout_level_advantage(data, adv_estimator, **compute_advantage_kwargs)
        small_groups = float(data.meta_info.pop("n_small_groups"))
    else:
        data = compute_advantage(data, adv_estimator=adv_estimator, **compute_advantage_kwargs)
        small_groups = 0.0  # verl's own advantage over rows: its statistics, unchanged
    data, metrics = select_update_batch(
        data,
        ppo_mini_batch_size=settings.ppo_mini_batch_size,
        rollout_n=settings.rollout_n,
        max_ppo_update_times=settings.max_ppo_update_times,
        rng=rng,
    )
    metrics["training/n_small_groups"] = small_groups
    if len(data) > 0:
        metrics.update(advantage_metrics(data, "critic/advantages"))
    if settings.per_rollout_mean and len(data) > 0:
        data = normalize_batch_advantages(data)
        metrics.update(advantage_metrics(data, "training/advantages_normalized"))
    return data, metrics


def off_policy(
    data: DataProto, trained_version: int | None, max_staleness: int | None
) -> tuple[DataProto | None, dict[str, float]]:
    """The update batch's staleness against `trained_version` (`staleness.staleness_metrics`) and,
    with `max_staleness`, the batch with the older tokens masked (`staleness.mask_stale_tokens`):
    they are not trained, and the other tokens keep their weights. None when no token is left.
    The per-token versions leave the batch here: verl's update does not read them."""
    versions = data.batch.pop(SAMPLING_VERSIONS)
    if trained_version is None or len(data) == 0:
        return data, {}
    mask = data.batch["response_mask"]
    metrics = staleness_metrics(versions, mask, trained_version)
    if max_staleness is None:
        return data, metrics
    data.batch["response_mask"], masked = mask_stale_tokens(versions, mask, trained_version, max_staleness)
    metrics.update(masked)
    if not data.batch["response_mask"].any():
        logger.warning(
            "every trained token of this step is more than %d weight versions old "
            "(agentlightning.max_token_staleness): no update",
            max_staleness,
        )
        return None, metrics
    return data, metrics


def advantage_metrics(data: DataProto, prefix: str) -> dict[str, float]:
    """`<prefix>/mean|max|min` of the advantages on response tokens, as verl's `compute_data_metrics`
    computes `critic/advantages/*`."""
    values = torch.masked_select(data.batch["advantages"], data.batch["response_mask"].bool())
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }
