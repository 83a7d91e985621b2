"""What the `AglTrainer.fit()` tests on the CPU read back from a run's store (test_fit_*.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path


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
