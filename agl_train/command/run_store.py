"""What a run's store says after or during the run: the rewards by weight version, the first failure."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agl_store import call_span
from agl_store.sqlite import SQLiteStore

from ..core.traces import final_reward
from ..runner.outcome import METADATA_KEY


def rewards_by_version(db_path: Path) -> dict[int, list[float]]:
    """Per-rollout rewards of the training rollouts in the store at `db_path`, by the weight
    version (`agl.model_version`, the step) of their model call."""

    async def read() -> dict[int, list[float]]:
        async with SQLiteStore(str(db_path)) as store:
            by_version: dict[int, list[float]] = {}
            for rollout in await store.query_rollouts(mode="train", status_in=["succeeded"]):
                spans = await store.query_spans(rollout.rollout_id, "latest")
                versions = {s.attributes.get(call_span.MODEL_VERSION) for s in spans if s.name == call_span.NAME}
                reward = final_reward(spans)
                version = versions.pop() if len(versions) == 1 else None
                if version is not None and reward is not None:
                    by_version.setdefault(int(version), []).append(reward)
            return by_version

    return asyncio.run(read())


def first_failure(db_path: Path) -> str | None:
    """The error of the earliest failed rollout in the store at `db_path` (the agent's output, or why it
    was cancelled or timed out), or None while none failed."""

    async def read() -> str | None:
        async with SQLiteStore(str(db_path)) as store:
            for rollout in await store.query_rollouts(status_in=["failed"], sort_by="start_time", limit=1):
                attempt = await store.get_latest_attempt(rollout.rollout_id)
                outcome = ((attempt.metadata if attempt else None) or {}).get(METADATA_KEY) or {}
                return str(outcome.get("message") or outcome.get("status") or "no message")
            return None

    return asyncio.run(read()) if db_path.exists() else None
