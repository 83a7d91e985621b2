"""Deleting the rollouts a training run no longer needs, after each checkpoint.

`agentlightning.retention.keep_steps` (null by default: keep everything) keeps this run's
rollouts of its newest `keep_steps` steps and deletes its other finished rollouts, except those
of groups still in flight (carried over to the next step). A run's rollouts are those tagged
with its id (`runner.ownership`): another run's in a shared store are never touched. A step is
a resource set the run's rollouts were enqueued under (the trainer publishes one per weight
version, which its validation shares). Resuming needs only the groups the checkpoint carried,
which are in flight. The store deletes in chunks (`delete_rollouts`), so the proxy's writes go
on meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from agl_store.base import LightningStore
from agl_store.models import TERMINAL_ROLLOUT_STATUSES

from .groups import Group, GroupTracker
from .ownership import RUN_KEY

logger = logging.getLogger(__name__)

PAGE = 1000
"""Rollouts read per page while looking for old ones."""


def keep_steps_of(agentlightning: Mapping[str, Any]) -> int | None:
    """`retention.keep_steps` of the `agentlightning` config: a positive int, or None (keep all)."""
    retention = agentlightning.get("retention") or {}
    value = retention.get("keep_steps")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"agentlightning.retention.keep_steps must be a positive integer or null, got {value!r}")
    return value


async def delete_old_rollouts(
    store: LightningStore, keep_steps: int | None, in_flight: Iterable[Group], *, run_id: str
) -> int:
    """Delete run `run_id`'s finished rollouts of steps older than its newest `keep_steps`,
    except those of the `in_flight` groups; how many were deleted. None keeps everything."""
    if keep_steps is None:
        return 0
    kept_rollouts = {rollout_id for group in in_flight for rollout_id in group.rollout_ids}
    mine = []
    offset = 0
    while True:
        page = await store.query_rollouts(sort_by="start_time", limit=PAGE, offset=offset)
        mine += [rollout for rollout in page if (rollout.metadata or {}).get(RUN_KEY) == run_id]
        if len(page) < PAGE:
            break
        offset += PAGE
    used = {rollout.resources_id for rollout in mine if rollout.resources_id is not None}
    newest_first = await store.query_resources(sort_by="update_time", sort_order="desc")
    kept_steps = [resources.resources_id for resources in newest_first if resources.resources_id in used][:keep_steps]
    old = [
        rollout.rollout_id
        for rollout in mine
        if rollout.status in TERMINAL_ROLLOUT_STATUSES
        and rollout.resources_id is not None
        and rollout.resources_id not in kept_steps
        and rollout.rollout_id not in kept_rollouts
    ]
    if old:
        await store.delete_rollouts(old)
        logger.info(
            "retention: deleted %d rollouts of run %s older than its last %d steps", len(old), run_id, keep_steps
        )
    return len(old)


async def after_checkpoint(
    store: LightningStore | None, agentlightning: Mapping[str, Any], tracker: GroupTracker | None, run_id: str
) -> int:
    """What the trainer runs after saving a checkpoint: `delete_old_rollouts` of run `run_id`
    with its config, keeping the groups its tracker has in flight."""
    if store is None:
        return 0
    in_flight = tracker.in_flight if tracker is not None else []
    return await delete_old_rollouts(store, keep_steps_of(agentlightning), in_flight, run_id=run_id)
