"""Which run a rollout belongs to, and how a resumed run takes over what a killed one left.

Every rollout a trainer enqueues carries two metadata tags: `agl.run`, the run's id (kept in
its checkpoints, so the same id goes on across resumes), and `agl.launch`, the id of this
process's launch of it. The trainer's dispatcher claims only rollouts of its own launch (a
store-side filter on dequeue), so a store shared with other runs, or holding what a killed
launch enqueued after its last checkpoint, never makes it run someone else's rollouts.

A resumed launch calls `take_over` before its dispatcher starts: the groups its checkpoint
names are re-tagged to the new launch and taken back in flight (rollouts the dead dispatcher
had claimed go back in the queue), and every other unfinished rollout of the run — groups
enqueued after the checkpoint, validation rollouts — is cancelled.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agl_store.base import LightningStore
from agl_store.errors import StoreError
from agl_store.models import ACTIVE_ROLLOUT_STATUSES, QUEUED_ROLLOUT_STATUSES

from .groups import Group, GroupTracker

RUN_KEY = "agl.run"
LAUNCH_KEY = "agl.launch"


@dataclass(frozen=True)
class RunIdentity:
    """A training run's id and the id of this launch of it (a resume is a new launch)."""

    run_id: str
    launch_id: str

    @classmethod
    def new(cls) -> RunIdentity:
        return cls(run_id=uuid.uuid4().hex, launch_id=uuid.uuid4().hex)

    @classmethod
    def resume(cls, run_id: str) -> RunIdentity:
        """The next launch of the run `run_id` (read from its checkpoint)."""
        return cls(run_id=run_id, launch_id=uuid.uuid4().hex)

    @property
    def tags(self) -> dict[str, str]:
        """The metadata every rollout of this launch carries."""
        return {RUN_KEY: self.run_id, LAUNCH_KEY: self.launch_id}

    @property
    def claims(self) -> dict[str, str]:
        """The dequeue filter of this launch's dispatcher."""
        return {LAUNCH_KEY: self.launch_id}


@dataclass(frozen=True)
class TakeOver:
    """What a resumed launch did with what the killed one left: groups adopted, rollouts of
    theirs put back in the queue, other unfinished rollouts of the run cancelled."""

    adopted: int
    requeued: int
    cancelled: int

    @property
    def metrics(self) -> dict[str, float]:
        return {
            "resume/n_groups_adopted": float(self.adopted),
            "resume/n_rollouts_requeued": float(self.requeued),
            "resume/n_rollouts_cancelled": float(self.cancelled),
        }


async def take_over(
    store: LightningStore,
    tracker: GroupTracker,
    identity: RunIdentity,
    checkpointed: Sequence[Mapping[str, Any]],
    *,
    orphaned_worker_id: str | None,
) -> TakeOver:
    """Adopt the checkpoint's groups in flight into `tracker` and cancel the run's other
    unfinished rollouts (see the module's docstring). `orphaned_worker_id` is the worker id of
    the killed launch's dispatcher (`GroupTracker.adopt`)."""
    groups = [Group.from_json(group) for group in checkpointed]
    adopted_ids = {rid for group in groups for rid in group.rollout_ids}
    unfinished = await store.query_rollouts(status_in=sorted(QUEUED_ROLLOUT_STATUSES | ACTIVE_ROLLOUT_STATUSES))
    for rollout in unfinished:
        if rollout.rollout_id in adopted_ids:
            await store.update_rollout(rollout.rollout_id, metadata={**(rollout.metadata or {}), **identity.tags})
    requeued = await tracker.adopt(groups, orphaned_worker_id=orphaned_worker_id)
    cancelled = 0
    for rollout in unfinished:
        tags = rollout.metadata or {}
        if rollout.rollout_id in adopted_ids or tags.get(RUN_KEY) != identity.run_id:
            continue
        try:
            await store.update_rollout(rollout.rollout_id, status="cancelled")
            cancelled += 1
        except StoreError:
            pass  # deleted meanwhile: nothing to cancel
    return TakeOver(adopted=len(groups), requeued=requeued, cancelled=cancelled)


__all__ = ["LAUNCH_KEY", "RUN_KEY", "RunIdentity", "TakeOver", "take_over"]
