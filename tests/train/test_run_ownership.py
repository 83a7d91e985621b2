"""A run owns its rollouts: its dispatcher claims only them, and a resumed run takes back what
its checkpoint names and cancels the rest of what the killed run left in the store."""

from __future__ import annotations

from pathlib import Path

from agl_store.base import LightningStore
from agl_store.models import LLM, AttemptedRollout
from agl_store.sqlite.store import SQLiteStore
from agl_train.runner.dispatch import WORKER_ID, RolloutDispatcher
from agl_train.runner.env import RolloutEndpoints
from agl_train.runner.groups import GroupTracker
from agl_train.runner.outcome import RolloutOutcome
from agl_train.runner.ownership import RunIdentity, take_over

PATIENCE_S = 30.0  # bounds a broken test only


class RecordingRunner:
    """Succeeds every rollout at once and remembers the order it was given them in."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    async def run(self, rollout: AttemptedRollout, endpoints: RolloutEndpoints) -> RolloutOutcome:
        self.ran.append(rollout.rollout_id)
        return RolloutOutcome(rollout.rollout_id, rollout.attempt.attempt_id, "succeeded", reward=1.0)


async def killed_run(store: LightningStore, identity: RunIdentity) -> tuple[GroupTracker, list[str], list[str]]:
    """A run's state when SIGKILLed: two groups checkpointed (one rollout claimed by its dead
    dispatcher), then two more groups and a validation rollout enqueued after the checkpoint."""
    tracker = GroupTracker(store, 2, metadata=identity.tags)
    checkpointed = await tracker.submit(["a", "b"])
    await store.dequeue_rollout(worker_id=WORKER_ID, metadata=identity.claims)  # its agent died with the run
    orphans = await tracker.submit(["c", "d"])
    val = await GroupTracker(store, 1, mode="val", metadata=identity.tags).submit(["v"])
    orphan_ids = [rid for group in orphans + val for rid in group.rollout_ids]
    return tracker, [rid for group in checkpointed for rid in group.rollout_ids], orphan_ids


async def test_a_resumed_run_runs_its_checkpointed_groups_and_cancels_what_the_killed_run_left(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "store.db") as store:
        await store.add_resources({"main_llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")})  # never called
        first = RunIdentity.new()
        killed, checkpointed_ids, orphan_ids = await killed_run(store, first)
        stranger = await GroupTracker(store, 1, metadata=RunIdentity.new().tags).submit(["another run's"])
        checkpoint = [group.to_json() for group in killed.in_flight[:2]]

        resumed = RunIdentity.resume(first.run_id)
        tracker = GroupTracker(store, 2, metadata=resumed.tags)
        taken = await take_over(store, tracker, resumed, checkpoint, orphaned_worker_id=WORKER_ID)
        runner = RecordingRunner()
        dispatcher = RolloutDispatcher(store, runner, max_concurrency=8, claim_metadata=resumed.claims)
        await dispatcher.start()
        try:
            collected = await tracker.collect(2, timeout_s=PATIENCE_S)
        finally:
            await dispatcher.stop()

        assert len(collected.groups) == 2 and collected.counts["succeeded"] == 4
        assert sorted(runner.ran) == sorted(checkpointed_ids)  # nobody else's, and each once
        assert taken.adopted == 2 and taken.requeued == 1 and taken.cancelled == len(orphan_ids) == 5
        for rid in orphan_ids:
            assert (await store.get_rollout_by_id(rid)).status == "cancelled"
        assert (await store.get_rollout_by_id(stranger[0].rollout_ids[0])).status == "queuing"


def test_a_run_identity_names_the_run_and_this_launch_of_it() -> None:
    first = RunIdentity.new()
    again = RunIdentity.resume(first.run_id)
    assert again.run_id == first.run_id and again.launch_id != first.launch_id
    assert first.claims == {"agl.launch": first.launch_id}
    assert first.tags == {"agl.run": first.run_id, "agl.launch": first.launch_id}
