"""GroupTracker against a real SQLite store: what abandoning a step leaves behind."""

from __future__ import annotations

from pathlib import Path

from agl_store import SQLiteStore
from agl_train.runner.groups import GroupTracker


async def test_abandon_cancels_only_the_rollouts_still_unfinished(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "store.db") as store:
        tracker = GroupTracker(store, n=2)
        (group,) = await tracker.submit([{"question": "2 + 3?"}])
        finished_id, running_id = group.rollout_ids
        for _ in group.rollout_ids:
            await store.dequeue_rollout(worker_id="runner")
        # It finishes after the tracker's last look: abandoning must not overwrite its ending.
        await store.update_attempt(finished_id, "latest", status="succeeded")

        counts = await tracker.abandon()

        assert counts == {"succeeded": 0, "failed": 0, "timeout": 2}
        assert (await store.get_rollout_by_id(finished_id)).status == "succeeded"
        assert (await store.get_rollout_by_id(running_id)).status == "cancelled"
        assert tracker.in_flight == []
