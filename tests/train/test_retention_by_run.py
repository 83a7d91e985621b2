"""Retention keeps this run's newest steps and never touches another run's rollouts in a shared store."""

from __future__ import annotations

from pathlib import Path

from agl_store.models import LLM
from agl_store.sqlite import SQLiteStore
from agl_train.runner.ownership import RunIdentity
from agl_train.runner.retention import delete_old_rollouts


async def test_retention_deletes_only_this_runs_old_steps(tmp_path: Path) -> None:
    mine, theirs = RunIdentity.new(), RunIdentity.new()
    async with SQLiteStore(tmp_path / "agl.db") as store:
        steps: dict[str, list[list[str]]] = {mine.run_id: [], theirs.run_id: []}
        for step in range(3):
            for run in (mine, theirs):  # two trainers on one store, each publishing its own set per step
                resources = await store.add_resources({"main_llm": LLM(endpoint=f"http://s{step}/v1", model="m")})
                ids = []
                for _ in range(2):
                    rollout = await store.start_rollout(
                        {"step": step}, resources_id=resources.resources_id, metadata=run.tags
                    )
                    await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")
                    ids.append(rollout.rollout_id)
                steps[run.run_id].append(ids)

        deleted = await delete_old_rollouts(store, 2, [], run_id=mine.run_id)

        left = {rollout.rollout_id for rollout in await store.query_rollouts()}
        assert deleted == 2  # keep_steps=2 of this run's 3 steps: its step 0 goes
        assert left == {*steps[mine.run_id][1], *steps[mine.run_id][2], *(r for s in steps[theirs.run_id] for r in s)}
