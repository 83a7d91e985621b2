"""What the training page shows: per training step, rewards, outcomes, rows and trained tokens.

A step is one resource set the trainer published (`publish_replicas`: one per weight version,
so one per training step, which validation shares). Its rollouts are those enqueued under its `resources_id`; since the
trainer enqueues them right after publishing, the store is asked only for the rollouts started
between the set's creation and the next set's, and those are filtered by `resources_id`. The
step's number is the earliest `agl.model_version` its LLM calls were served with: the version
published with the set (the trainer's global step), since in asynchronous training later calls
of the same rollouts may be served by newer weights. A train set and a validation set of the
same version are one step on the page.

Rows and trained tokens are those the trace aggregator builds from succeeded rollouts, at the
view's level and limits, as the trainer would. Everything read here is cached once it can no
longer change: a finished rollout's record (`SummaryCache`), and a whole step once all its
rollouts are finished and a newer set exists (no rollout is enqueued under it any more). So a
live refresh reads the spans of the rollouts that finished since the last one, and nothing else.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agl_store import call_span
from agl_store.base import LightningStore
from agl_store.models import TERMINAL_ROLLOUT_STATUSES, AttemptedRollout, ResourcesUpdate, Rollout, Span

from ..core.aggregate import get_aggregator
from ..core.traces import trace_from_spans
from ..runner.outcome import METADATA_KEY
from .summaries import SummaryCache
from .token_view import TokenViewOptions

OUTCOMES = ("succeeded", "failed", "timeout", "cancelled", "running", "queued")
MAX_STEPS_PAGE = 100
"""The most resource sets one steps request summarises."""
_READ_CHUNK = 16
"""Rollouts whose spans are read at once: a store behind HTTP answers them in parallel."""
_WINDOW_MARGIN_S = 1.0
"""Rollouts started this close outside a set's window are read too (and kept only by `resources_id`)."""


def outcome(rollout: Rollout) -> str:
    """How a rollout ended, as the trainer counts it: a failed attempt that timed out (or went
    unresponsive) is `timeout`; unfinished ones are `running` or `queued`."""
    if rollout.status == "succeeded" or rollout.status == "cancelled":
        return rollout.status
    attempt = rollout.attempt if isinstance(rollout, AttemptedRollout) else None
    if rollout.status == "failed":
        if attempt is not None and attempt.status in ("timeout", "unresponsive"):
            return "timeout"
        if attempt is not None and (attempt.metadata or {}).get(METADATA_KEY, {}).get("status") == "timeout":
            return "timeout"
        return "failed"
    return "queued" if rollout.status in ("queuing", "requeuing") else "running"


def _version_order(version: str) -> tuple[int, int | str]:
    # Global steps compare as numbers; any other label after them, as text.
    return (0, int(version)) if version.isdigit() else (1, version)


def earliest_version(versions: Iterable[str | None]) -> str | None:
    """The earliest of weight versions (None ones left out), or None."""
    known = [version for version in versions if version is not None]
    return min(known, key=_version_order) if known else None


def model_version(spans: Iterable[Span]) -> str | None:
    """The earliest weight version the spans' LLM calls were served with, or None."""
    return earliest_version(
        str(span.attributes[call_span.MODEL_VERSION])
        for span in spans
        if span.name == call_span.NAME and span.attributes.get(call_span.MODEL_VERSION) is not None
    )


def rollout_record(rollout: Rollout, spans: Sequence[Span], options: TokenViewOptions) -> dict[str, Any]:
    """One rollout's part of its step: mode, outcome, reward, weight version, rows and trained tokens."""
    trace = trace_from_spans(rollout.rollout_id, spans, reward_fillna_value=options.reward_fillna_value)
    rows: list[Any] = []
    if rollout.status == "succeeded":  # the trainer trains succeeded rollouts only
        rows, _ = get_aggregator(options.level)(trace, options.limits, None)
    return {
        "mode": rollout.mode or "train",
        "outcome": outcome(rollout),
        "reward": trace.reward if trace.has_reward else None,
        "version": model_version(spans),
        "rows": len(rows),
        "trained_tokens": sum(sum(row.response_mask) for row in rows if not row.is_drop),
    }


@dataclass
class Spread:
    """Count, mean, standard deviation (population), min and max, mergeable across sets."""

    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    def add(self, value: float) -> None:
        self.n += 1
        self.total += value
        self.total_sq += value * value
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def as_json(self) -> dict[str, Any]:
        if not self.n:
            return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
        mean = self.total / self.n
        return {
            "n": self.n,
            "mean": mean,
            "std": math.sqrt(max(self.total_sq / self.n - mean * mean, 0.0)),
            "min": self.low,
            "max": self.high,
        }


def mode_summary(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Outcome counts, the reward spread of succeeded rollouts, rows and trained tokens."""
    counts = dict.fromkeys(OUTCOMES, 0)
    reward = Spread()
    rows = trained = without_reward = 0
    for record in records:
        counts[record["outcome"]] += 1
        rows += record["rows"]
        trained += record["trained_tokens"]
        if record["outcome"] == "succeeded":
            if record["reward"] is None:
                without_reward += 1
            else:
                reward.add(record["reward"])
    return {
        "rollouts": sum(counts.values()),
        **counts,
        "reward": reward.as_json(),
        "without_reward": without_reward,
        "rows": rows,
        "trained_tokens": trained,
    }


class StepCache:
    """Finished steps by resources id: they never change again. Bounded, oldest out first."""

    def __init__(self, max_entries: int = 2_000) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, float], dict[str, Any]] = OrderedDict()

    def get(self, key: tuple[str, float]) -> dict[str, Any] | None:
        if key in self._entries:
            self._entries.move_to_end(key)
        return self._entries.get(key)

    def put(self, key: tuple[str, float], summary: dict[str, Any]) -> None:
        self._entries[key] = summary
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


class StepSummaries:
    """The training page's data over one store, with the caches that keep a live refresh cheap."""

    def __init__(self, options: TokenViewOptions) -> None:
        self.options = options
        self._rollouts = SummaryCache()
        self._steps = StepCache()

    async def _record(self, store: LightningStore, rollout: Rollout) -> dict[str, Any]:
        cached = self._rollouts.get(rollout)
        if cached is not None:
            return cached
        if rollout.status not in TERMINAL_ROLLOUT_STATUSES:
            # Not trained yet: its spans are read once it has finished.
            return {
                "mode": rollout.mode or "train",
                "outcome": outcome(rollout),
                "reward": None,
                "version": None,
                "rows": 0,
                "trained_tokens": 0,
            }
        spans = await store.query_spans(rollout.rollout_id, "latest") if isinstance(rollout, AttemptedRollout) else []
        record = await asyncio.to_thread(rollout_record, rollout, spans, self.options)
        self._rollouts.put(rollout, record)
        return record

    async def _set_summary(
        self, store: LightningStore, resources: ResourcesUpdate, window_end: float | None
    ) -> dict[str, Any]:
        key = (resources.resources_id, resources.create_time)
        cached = self._steps.get(key)
        if cached is not None:
            return cached
        started = await store.query_rollouts(
            start_time_after=resources.create_time - _WINDOW_MARGIN_S,
            start_time_before=None if window_end is None else window_end + _WINDOW_MARGIN_S,
        )
        rollouts = [rollout for rollout in started if rollout.resources_id == resources.resources_id]
        records: list[dict[str, Any]] = []
        for start in range(0, len(rollouts), _READ_CHUNK):
            chunk = rollouts[start : start + _READ_CHUNK]
            records += await asyncio.gather(*(self._record(store, rollout) for rollout in chunk))
        version = earliest_version(record["version"] for record in records) or await _running_version(store, rollouts)
        summary = {
            "step": version,
            "resources_ids": [resources.resources_id],
            "published": resources.create_time,
            "finished": window_end is not None and all(r["outcome"] not in ("running", "queued") for r in records),
            "records": records,
        }
        if summary["finished"]:
            self._steps.put(key, summary)
        return summary

    async def steps(self, store: LightningStore, limit: int = 20, offset: int = 0) -> dict[str, Any]:
        """A page of steps, newest first: `limit` resource sets from `offset`, those of one
        weight version merged into one step, each with its modes' summaries."""
        limit = max(1, min(limit, MAX_STEPS_PAGE))
        offset = max(0, offset)
        # One set per step and validation: a few thousand at most over a run, and no spans in them.
        sets = await store.query_resources(sort_by="create_time", sort_order="desc")
        page = sets[offset : offset + limit]
        summaries = [
            await self._set_summary(store, resources, sets[offset + k - 1].create_time if offset + k else None)
            for k, resources in enumerate(page)
        ]
        merged: dict[str, dict[str, Any]] = {}
        for summary in summaries:
            key = summary["step"] if summary["step"] is not None else summary["resources_ids"][0]
            step = merged.setdefault(
                key,
                {"step": summary["step"], "resources_ids": [], "published": summary["published"], "records": []},
            )
            step["resources_ids"] += summary["resources_ids"]
            step["published"] = min(step["published"], summary["published"])
            step["records"] += summary["records"]
            step["finished"] = step.get("finished", True) and summary["finished"]
        steps = []
        for step in merged.values():
            by_mode: dict[str, list[dict[str, Any]]] = {}
            for record in step.pop("records"):
                by_mode.setdefault(record["mode"], []).append(record)
            steps.append({**step, "modes": {mode: mode_summary(records) for mode, records in sorted(by_mode.items())}})
        return {"steps": steps, "total": len(sets), "limit": limit, "offset": offset}


async def _running_version(store: LightningStore, rollouts: Sequence[Rollout]) -> str | None:
    """The version of a set none of whose rollouts has finished: from a running rollout's first call
    (the first few tried, so a set whose rollouts have made no call yet costs a few queries)."""
    for rollout in [r for r in rollouts if isinstance(r, AttemptedRollout)][:3]:
        spans = await store.query_spans(rollout.rollout_id, "latest", name=call_span.NAME, limit=1)
        if spans:
            return model_version(spans)
    return None
