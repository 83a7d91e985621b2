"""What the rollout list and the rollout page show: one page of rollouts, one rollout's spans.

Everything is read through the `LightningStore` interface, one page at a time, so the view
stays fast on a store with 100,000 rollouts: the store filters and pages, and only the
rollouts on the page have their spans read.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agl_store import call_span
from agl_store.base import LightningStore
from agl_store.errors import NotFoundError
from agl_store.models import (
    REWARD_VALUE_ATTRIBUTE,
    TERMINAL_ROLLOUT_STATUSES,
    AttemptedRollout,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
)

from ..core.traces import final_reward

MAX_PAGE_SIZE = 200
"""The most rollouts one list request returns: a page, never the store."""


@dataclass(frozen=True)
class RolloutFilter:
    """The list page's filters and page, passed to `LightningStore.query_rollouts` as they are."""

    status_in: Sequence[RolloutStatus] | None = None
    mode: RolloutMode | None = None
    start_time_after: float | None = None
    start_time_before: float | None = None
    rollout_id_contains: str | None = None
    limit: int = 50
    offset: int = 0


def _attempt_count(rollout: Rollout) -> int:
    # An AttemptedRollout carries its latest attempt, whose sequence_id is the attempt number.
    return rollout.attempt.sequence_id if isinstance(rollout, AttemptedRollout) else 0


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def span_tokens(span: Span) -> dict[str, int]:
    """Tokens in and out of an LLM-call span: usage when recorded, else the token-id arrays."""
    attributes = span.attributes
    tokens_in = _int(attributes.get(call_span.INPUT_TOKENS))
    tokens_out = _int(attributes.get(call_span.OUTPUT_TOKENS))
    if not tokens_in and isinstance(attributes.get(call_span.PROMPT_TOKEN_IDS), list):
        tokens_in = len(attributes[call_span.PROMPT_TOKEN_IDS])
    if not tokens_out and isinstance(attributes.get(call_span.CHOICES), list):
        tokens_out = sum(
            len(choice.get("token_ids") or []) for choice in attributes[call_span.CHOICES] if isinstance(choice, dict)
        )
    return {"in": tokens_in, "out": tokens_out}


def _duration(start: float | None, end: float | None, now: float) -> float | None:
    if start is None:
        return None
    return (end if end is not None else now) - start


def summarize_rollout(rollout: Rollout, spans: Sequence[Span], now: float) -> dict[str, Any]:
    """One line of the rollout list: status, attempts, reward, LLM calls, tokens, duration.

    `spans` are those of the latest attempt: the ones the trainer reads. The reward is the
    trainer's own `final_reward`; None when the attempt recorded none.
    """
    calls = [span for span in spans if span.name == call_span.NAME]
    tokens = [span_tokens(span) for span in calls]
    return {
        "rollout_id": rollout.rollout_id,
        "status": rollout.status,
        "mode": rollout.mode,
        "start_time": rollout.start_time,
        "end_time": rollout.end_time,
        "duration": _duration(rollout.start_time, rollout.end_time, now),
        "attempts": _attempt_count(rollout),
        "reward": final_reward(spans),
        "n_calls": len(calls),
        "tokens_in": sum(t["in"] for t in tokens),
        "tokens_out": sum(t["out"] for t in tokens),
    }


class SummaryCache:
    """Summaries of finished rollouts, which no longer change, so live refresh re-reads only running ones.

    Bounded: the oldest entries go first once `max_entries` are held.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, int, float | None], dict[str, Any]] = OrderedDict()

    @staticmethod
    def _key(rollout: Rollout) -> tuple[str, int, float | None] | None:
        if rollout.status not in TERMINAL_ROLLOUT_STATUSES:
            return None
        return (rollout.rollout_id, _attempt_count(rollout), rollout.end_time)

    def get(self, rollout: Rollout) -> dict[str, Any] | None:
        """The cached summary of a finished rollout, or None."""
        key = self._key(rollout)
        if key is None or key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return self._entries[key]

    def put(self, rollout: Rollout, summary: dict[str, Any]) -> None:
        """Keep `summary` when the rollout is finished; running ones are never cached."""
        key = self._key(rollout)
        if key is None:
            return
        self._entries[key] = summary
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


async def _summary(store: LightningStore, rollout: Rollout, now: float, cache: SummaryCache | None) -> dict[str, Any]:
    cached = cache.get(rollout) if cache is not None else None
    if cached is not None:
        return cached
    spans = await store.query_spans(rollout.rollout_id, "latest") if _attempt_count(rollout) else []
    summary = summarize_rollout(rollout, spans, now)
    if cache is not None:
        cache.put(rollout, summary)
    return summary


async def list_rollouts(
    store: LightningStore, query: RolloutFilter, cache: SummaryCache | None = None
) -> dict[str, Any]:
    """One page of rollouts, newest first, with their summaries and the total match count.

    Only the rollouts on the page have their spans read (finished ones once, with a `cache`).
    """
    limit = max(1, min(query.limit, MAX_PAGE_SIZE))
    page = await store.query_rollouts(
        status_in=list(query.status_in) if query.status_in else None,
        mode=query.mode,
        start_time_after=query.start_time_after,
        start_time_before=query.start_time_before,
        rollout_id_contains=query.rollout_id_contains or None,
        sort_order="desc",
        limit=limit,
        offset=max(0, query.offset),
    )
    now = time.time()
    items = [await _summary(store, rollout, now, cache) for rollout in page]
    return {"items": items, "total": page.total, "limit": limit, "offset": max(0, query.offset)}


def span_line(span: Span) -> dict[str, Any]:
    """One span on the rollout's timeline (its request and response are fetched on demand)."""
    attributes = span.attributes
    line: dict[str, Any] = {
        "span_id": span.span_id,
        "attempt_id": span.attempt_id,
        "sequence_id": span.sequence_id,
        "name": span.name,
        "start_time": span.start_time,
        "end_time": span.end_time,
        "duration": None if span.start_time is None or span.end_time is None else span.end_time - span.start_time,
        "status": span.status.status_code,
        "status_description": span.status.description,
        "backend": attributes.get(call_span.BACKEND),
        "model": attributes.get(call_span.RESPONSE_MODEL) or attributes.get(call_span.REQUEST_MODEL),
    }
    if span.name == call_span.NAME:
        tokens = span_tokens(span)
        line.update(
            tokens_in=tokens["in"],
            tokens_out=tokens["out"],
            api=attributes.get(call_span.API),
            token_ids_status=attributes.get(call_span.TOKEN_IDS_STATUS),
            token_ids_cause=attributes.get(call_span.TOKEN_IDS_CAUSE),
            chain=attributes.get(call_span.CHAIN),
        )
    if REWARD_VALUE_ATTRIBUTE in attributes:
        line["reward"] = attributes[REWARD_VALUE_ATTRIBUTE]
    return line


async def rollout_detail(store: LightningStore, rollout_id: str) -> dict[str, Any]:
    """A rollout with its attempts and the spans of all its attempts in sequence order.

    The summary (reward, calls, tokens) is that of the latest attempt, as in the list.
    """
    rollout = await store.get_rollout_by_id(rollout_id)
    if rollout is None:
        raise NotFoundError(f"rollout {rollout_id!r} not found")
    attempts = await store.query_attempts(rollout_id) if _attempt_count(rollout) else []
    spans = await store.query_spans(rollout_id) if attempts else []
    latest = attempts[-1].attempt_id if attempts else None
    latest_spans = [span for span in spans if span.attempt_id == latest]
    return {
        "rollout": rollout.model_dump(mode="json", exclude={"attempt"}),
        "summary": summarize_rollout(rollout, latest_spans, time.time()),
        "attempts": [attempt.model_dump(mode="json") for attempt in attempts],
        "spans": _with_chain_parents([span_line(span) for span in spans]),
    }


def _with_chain_parents(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each call's chain parent (the call it continues or branched from) as that call's sequence
    number too, `chain_parent_sequence`: the attempt's graph as the span list shows it."""
    sequence_of = {line["span_id"]: line["sequence_id"] for line in lines}
    for line in lines:
        chain = line.get("chain")
        if isinstance(chain, dict) and chain.get("parent") is not None:
            line["chain_parent_sequence"] = sequence_of.get(chain["parent"])
    return lines


async def span_detail(store: LightningStore, rollout_id: str, span_id: str) -> dict[str, Any]:
    """The whole span: request, response, token ids and every other attribute."""
    spans = await store.query_spans(rollout_id, span_id=span_id)
    if not spans:
        raise NotFoundError(f"span {span_id!r} of rollout {rollout_id!r} not found")
    return spans[0].model_dump(mode="json")
