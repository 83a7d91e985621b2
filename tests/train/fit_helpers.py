"""What the `AglTrainer.fit()` tests on the CPU read back from a run's store (test_fit_*.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agl_train.core.traces import RolloutTrace


def llm_calls_by_version(db_path: Path) -> dict[str, int]:
    """The training rollouts' `agl.llm_call` spans in the store at `db_path`, counted by weight version."""
    from agl_store import call_span
    from agl_store.sqlite import SQLiteStore

    async def count() -> dict[str, int]:
        store = await SQLiteStore(str(db_path)).open()
        try:
            counts: Counter[str] = Counter()
            for rollout in await store.query_rollouts(mode="train"):
                for span in await store.query_spans(rollout.rollout_id, name=call_span.NAME):
                    counts[span.attributes.get(call_span.MODEL_VERSION)] += 1
            return dict(counts)
        finally:
            await store.close()

    return asyncio.run(count())


def traces_by_step(db_path: Path) -> dict[int, list[RolloutTrace]]:
    """The succeeded training rollouts in the store at `db_path`, read as the trainer reads them
    (`traces.read_rollout`, under their group's uid), by the weight version (step) of their calls."""
    from agl_store import call_span
    from agl_store.sqlite import SQLiteStore
    from agl_train.core.traces import read_rollout
    from agl_train.runner.groups import UID_KEY

    async def read() -> dict[int, list[RolloutTrace]]:
        store = await SQLiteStore(str(db_path)).open()
        try:
            by_step: dict[int, list[RolloutTrace]] = {}
            for rollout in await store.query_rollouts(mode="train", status_in=["succeeded"]):
                spans = await store.query_spans(rollout.rollout_id, name=call_span.NAME)
                (version,) = {span.attributes.get(call_span.MODEL_VERSION) for span in spans}
                trace = await read_rollout(store, rollout.rollout_id, uid=(rollout.metadata or {})[UID_KEY])
                by_step.setdefault(int(version), []).append(trace)
            return by_step
        finally:
            await store.close()

    return asyncio.run(read())
