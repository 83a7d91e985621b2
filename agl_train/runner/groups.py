"""Prompt groups in flight: `n` rollouts per prompt, enqueued together, trained together.

`GroupTracker.submit(inputs)` enqueues one group per input (`n` rollouts sharing a `uid`);
`collect(count, timeout_s)` waits until `count` groups have every rollout finished and returns
the first ones to complete, in completion order; unfinished groups stay in flight and are
carried over to the next `collect` (async rollout). Groups still unfinished when a sync step
gives up are cancelled with `abandon()`. A resumed trainer takes back the groups its
checkpoint recorded as in flight with `adopt(groups)` instead of enqueuing their prompts again.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agl_store.base import LightningStore
from agl_store.errors import StoreError
from agl_store.models import (
    QUEUED_ROLLOUT_STATUSES,
    TERMINAL_ROLLOUT_STATUSES,
    EnqueueRolloutRequest,
    RolloutConfig,
    RolloutMode,
)

from .outcome import METADATA_KEY

POLL_S = 0.25
QUERY_CHUNK = 500
UID_KEY = "agl.uid"
STATUS_SUCCEEDED = "succeeded"
COUNT_KEYS = ("succeeded", "failed", "timeout")


@dataclass
class Group:
    """The `n` rollouts of one prompt. `outcomes` maps rollout id → succeeded / failed / timeout."""

    uid: str
    input: Any
    rollout_ids: list[str]
    outcomes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The group as a checkpoint records it (its outcomes are read again from the store)."""
        return {"uid": self.uid, "input": self.input, "rollout_ids": list(self.rollout_ids)}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Group:
        return cls(uid=str(value["uid"]), input=value["input"], rollout_ids=[str(r) for r in value["rollout_ids"]])

    @property
    def complete(self) -> bool:
        return len(self.outcomes) == len(self.rollout_ids)

    def succeeded(self) -> list[str]:
        return [rid for rid in self.rollout_ids if self.outcomes.get(rid) == STATUS_SUCCEEDED]


@dataclass(frozen=True)
class Collected:
    """The groups a step trains on, and how their rollouts ended."""

    groups: list[Group]
    counts: Mapping[str, int]
    carried_over: int

    @property
    def metrics(self) -> dict[str, float]:
        return {
            "rollout/n_done": float(self.counts.get("succeeded", 0)),
            "rollout/n_failed": float(self.counts.get("failed", 0)),
            "rollout/n_timed_out": float(self.counts.get("timeout", 0)),
            "rollout/n_groups": float(len(self.groups)),
            "rollout/n_groups_carried_over": float(self.carried_over),
        }


class GroupTracker:
    """Enqueues prompt groups and reports them as they complete.

    `rollout_config` goes with every rollout (the trainer sets a store-side timeout a little
    past the runner's own, as a backstop for runners that disappear); `metadata` goes in every
    rollout's metadata (the run's tags, `ownership.RunIdentity.tags`).
    """

    def __init__(
        self,
        store: LightningStore,
        n: int,
        *,
        rollout_config: RolloutConfig | None = None,
        mode: RolloutMode = "train",
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        if n <= 0:
            raise ValueError(f"n (rollouts per prompt) must be positive, got {n}")
        self.store = store
        self.n = n
        self.rollout_config = rollout_config or RolloutConfig()
        self.mode = mode
        self.metadata = dict(metadata or {})
        self.in_flight: list[Group] = []
        self._completed_order: list[Group] = []

    async def submit(
        self, inputs: Sequence[Any], *, resources_id: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> list[Group]:
        """Enqueue `n` rollouts for each input, in one store transaction."""
        uids = [uuid.uuid4().hex for _ in inputs]
        requests = [
            EnqueueRolloutRequest(
                input=item,
                mode=self.mode,
                resources_id=resources_id,
                config=self.rollout_config,
                metadata={**self.metadata, **(metadata or {}), UID_KEY: uid},
            )
            for item, uid in zip(inputs, uids, strict=False)
            for _ in range(self.n)
        ]
        rollouts = list(await self.store.enqueue_many_rollouts(requests)) if requests else []
        groups = [
            Group(uid=uid, input=item, rollout_ids=[r.rollout_id for r in rollouts[k * self.n : (k + 1) * self.n]])
            for k, (item, uid) in enumerate(zip(inputs, uids, strict=False))
        ]
        self.in_flight += groups
        return groups

    async def adopt(self, groups: Sequence[Group], *, orphaned_worker_id: str | None = None) -> int:
        """Take `groups` (enqueued by an earlier run of the trainer) back in flight: finished
        rollouts are read from the store by `refresh`, queued ones run when a runner claims them.
        A rollout whose latest attempt is still open under `orphaned_worker_id` (the worker id
        of the dispatcher that died with the earlier run: nobody will ever report its end) is
        put back in the queue for a new attempt; returns how many were. Rollouts deleted from
        the store since count as failed."""
        requeued = 0
        ids = [rid for group in groups for rid in group.rollout_ids]
        finished = await self._finished(ids)
        for group in groups:
            for rid in group.rollout_ids:
                if rid in finished:
                    continue
                rollout = await self.store.get_rollout_by_id(rid)
                if rollout is None:
                    group.outcomes[rid] = "failed"
                    continue
                attempt = await self.store.get_latest_attempt(rid)
                if (
                    orphaned_worker_id is not None
                    and attempt is not None
                    and attempt.worker_id == orphaned_worker_id
                    and rollout.status not in QUEUED_ROLLOUT_STATUSES
                ):
                    await self.store.update_attempt(rid, attempt.attempt_id, status="failed")
                    await self.store.update_rollout(rid, status="requeuing")
                    requeued += 1
        self.in_flight += list(groups)
        for group in groups:
            if group.complete:
                self._completed_order.append(group)
        return requeued

    async def refresh(self) -> None:
        """Read the status of every unfinished rollout in flight; note newly complete groups."""
        pending = [rid for g in self.in_flight if not g.complete for rid in g.rollout_ids if rid not in g.outcomes]
        if not pending:
            return
        by_id = await self._finished(pending)
        for group in self.in_flight:
            if group.complete:
                continue
            for rid in group.rollout_ids:
                if rid in by_id and rid not in group.outcomes:
                    group.outcomes[rid] = await self._outcome(by_id[rid].status, rid)
            if group.complete:
                self._completed_order.append(group)

    async def _finished(self, rollout_ids: list[str]) -> dict[str, Any]:
        """The finished rollouts among `rollout_ids`, by id."""
        by_id: dict[str, Any] = {}
        # Chunked: a large async batch has thousands of rollouts in flight, one query each
        # chunk keeps request bodies small on a served store.
        for start in range(0, len(rollout_ids), QUERY_CHUNK):
            chunk = rollout_ids[start : start + QUERY_CHUNK]
            finished = await self.store.query_rollouts(rollout_id_in=chunk, status_in=sorted(TERMINAL_ROLLOUT_STATUSES))
            by_id.update({r.rollout_id: r for r in finished})
        return by_id

    async def _outcome(self, rollout_status: str, rollout_id: str) -> str:
        if rollout_status == STATUS_SUCCEEDED:
            return "succeeded"
        attempt = await self.store.get_latest_attempt(rollout_id)
        if attempt is not None and attempt.status in ("timeout", "unresponsive"):
            return "timeout"
        if attempt is not None and (attempt.metadata or {}).get(METADATA_KEY, {}).get("status") == "timeout":
            return "timeout"
        return "failed"

    async def collect(self, count: int, timeout_s: float) -> Collected:
        """The first `count` groups to complete (fewer if `timeout_s` passes first); they
        leave the in-flight set, the others stay."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            await self.refresh()
            if len(self._completed_order) >= count or loop.time() >= deadline:
                break
            await asyncio.sleep(POLL_S)
        taken = self._completed_order[:count]
        self._completed_order = self._completed_order[count:]
        taken_ids = {id(g) for g in taken}
        self.in_flight = [g for g in self.in_flight if id(g) not in taken_ids]
        counts = {key: 0 for key in COUNT_KEYS}
        for group in taken:
            for outcome in group.outcomes.values():
                counts[outcome] += 1
        return Collected(groups=taken, counts=counts, carried_over=len(self.in_flight))

    async def abandon(self) -> dict[str, int]:
        """Cancel every rollout still in flight and forget its group; returns the counts
        (unfinished rollouts count as timed out)."""
        counts = {key: 0 for key in COUNT_KEYS}
        unfinished = []
        for group in self.in_flight:
            for rid in group.rollout_ids:
                if rid in group.outcomes:
                    counts[group.outcomes[rid]] += 1
                    continue
                counts["timeout"] += 1
                unfinished.append(rid)
        # The store lets any status be set, so a rollout that finished since the last look
        # would take the cancel: those keep their own ending.
        finished = await self._finished(unfinished)
        for rid in unfinished:
            if rid in finished:
                continue
            try:
                await self.store.update_rollout(rid, status="cancelled")
            except StoreError:
                pass  # deleted meanwhile: nothing to cancel
        self.in_flight = []
        self._completed_order = []
        return counts
