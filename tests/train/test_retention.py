"""`agentlightning.retention.keep_steps`: after a checkpoint, the rollouts of older steps go,
the recent steps' and the carried-over groups' stay."""

from __future__ import annotations

from pathlib import Path

import pytest

from agl_store.models import LLM
from agl_store.sqlite import SQLiteStore
from agl_train.runner.groups import Group
from agl_train.runner.ownership import RunIdentity
from agl_train.runner.retention import delete_old_rollouts, keep_steps_of

RUN = RunIdentity.new()


async def test_rollouts_of_older_steps_are_deleted_except_carried_groups(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "agl.db", retention_chunk_spans=2) as store:
        steps: list[list[str]] = []
        for step in range(4):  # each step publishes its resource set, then runs two rollouts on it
            resources = await store.add_resources({"main_llm": LLM(endpoint=f"http://step{step}/v1", model="m")})
            rollouts = []
            for _ in range(2):
                rollout = await store.start_rollout(
                    {"step": step}, resources_id=resources.resources_id, metadata=RUN.tags
                )
                await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")
                rollouts.append(rollout.rollout_id)
            steps.append(rollouts)
        first_set = (await store.query_resources())[0].resources_id
        running = await store.start_rollout({"step": 0}, resources_id=first_set, metadata=RUN.tags)
        carried = Group(uid="g", input={}, rollout_ids=[steps[0][0], running.rollout_id])

        assert await delete_old_rollouts(store, None, [carried], run_id=RUN.run_id) == 0
        assert await delete_old_rollouts(store, 2, [carried], run_id=RUN.run_id) == 3

        left = {rollout.rollout_id for rollout in await store.query_rollouts()}
        assert left == {steps[0][0], running.rollout_id, *steps[2], *steps[3]}
        assert await delete_old_rollouts(store, 2, [], run_id=RUN.run_id) == 1  # the group trained: its rollouts go too


def test_keep_steps_is_a_positive_integer_or_null() -> None:
    assert keep_steps_of({"retention": {"keep_steps": None}}) is None
    assert keep_steps_of({}) is None
    assert keep_steps_of({"retention": {"keep_steps": 3}}) == 3
    with pytest.raises(ValueError, match="agentlightning.retention.keep_steps"):
        keep_steps_of({"retention": {"keep_steps": 0}})
