"""Deleting the rollouts a training run no longer needs, after each checkpoint.

`agentlightning.retention.keep_steps` (null by default: keep everything) keeps the rollouts
of the newest `keep_steps` resource sets the trainer published (one per training step, and
one per validation) and deletes the other finished rollouts, except those of groups still in
flight (carried over to the next step). Resuming needs no rollout: a checkpoint holds the
prompts drawn but not trained, which are submitted again. The store deletes in chunks
(`delete_rollouts`), so the proxy's writes go on meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from agl_store.base import LightningStore
from agl_store.models import TERMINAL_ROLLOUT_STATUSES

from .groups import Group, GroupTracker

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


async def delete_old_rollouts(store: LightningStore, keep_steps: int | None, in_flight: Iterable[Group]) -> int:
    """Delete the finished rollouts older than the newest `keep_steps` resource sets, except
    those of the `in_flight` groups; how many were deleted. None keeps everything."""
    if keep_steps is None:
        return 0
    newest = await store.query_resources(sort_by="update_time", sort_order="desc", limit=keep_steps)
    kept_resources = {resources.resources_id for resources in newest}
    kept_rollouts = {rollout_id for group in in_flight for rollout_id in group.rollout_ids}
    old: list[str] = []
    offset = 0
    while True:
        page = await store.query_rollouts(
            status_in=sorted(TERMINAL_ROLLOUT_STATUSES), sort_by="start_time", limit=PAGE, offset=offset
        )
        for rollout in page:
            if (
                rollout.resources_id is not None
                and rollout.resources_id not in kept_resources
                and rollout.rollout_id not in kept_rollouts
            ):
                old.append(rollout.rollout_id)
        if len(page) < PAGE:
            break
        offset += PAGE
    if old:
        await store.delete_rollouts(old)
        logger.info("retention: deleted %d rollouts older than the last %d steps", len(old), keep_steps)
    return len(old)


async def after_checkpoint(
    store: LightningStore | None, agentlightning: Mapping[str, Any], tracker: GroupTracker | None
) -> int:
    """What the trainer runs after saving a checkpoint: `delete_old_rollouts` with its config,
    keeping the groups its tracker has in flight."""
    if store is None:
        return 0
    in_flight = tracker.in_flight if tracker is not None else []
    return await delete_old_rollouts(store, keep_steps_of(agentlightning), in_flight)
