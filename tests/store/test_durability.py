"""A served SQLite store survives SIGKILL mid-write: every acknowledged write is there after a
restart on the same file, and nothing is half-written (a span batch is all or nothing)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from agl_store import StoreError
from agl_store.client import LightningStoreClient
from agl_store.models import Span

from .http_server import StoreServerProcess

WRITERS = 4
BATCH = 20
ACKNOWLEDGED_BEFORE_KILL = 400

pytestmark = pytest.mark.slow


class Writer:
    """One client writing span batches and metadata updates to its own rollout until it fails."""

    def __init__(self, url: str, rollout_id: str, attempt_id: str) -> None:
        self.client = LightningStoreClient(url, retries=0, timeout=10.0)
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.acknowledged: dict[str, int] = {}  # span_id -> sequence_id
        self.last_metadata_step = 0

    async def run(self, enough: asyncio.Event, total: list[int]) -> None:
        step = 0
        async with self.client:
            while True:
                step += 1
                batch = [
                    Span(
                        rollout_id=self.rollout_id,
                        attempt_id=self.attempt_id,
                        name="agl.llm_call",
                        attributes={"batch": step, "agl.prompt_token_ids": list(range(64))},
                    )
                    for _ in range(BATCH)
                ]
                try:
                    stored = await self.client.add_many_spans(batch)
                    for span in stored:
                        assert span.sequence_id is not None
                        self.acknowledged[span.span_id] = span.sequence_id
                    total[0] += len(stored)
                    await self.client.update_rollout(self.rollout_id, metadata={"step": step})
                    self.last_metadata_step = step
                except StoreError:
                    return  # the server is gone
                if total[0] >= ACKNOWLEDGED_BEFORE_KILL:
                    enough.set()


async def test_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    server = StoreServerProcess(db)
    await server.start()
    rollouts: list[tuple[str, str]] = []
    async with LightningStoreClient(server.url) as setup:
        for i in range(WRITERS):
            attempted = await setup.start_rollout(input={"writer": i})
            rollouts.append((attempted.rollout_id, attempted.attempt.attempt_id))
    writers = [Writer(server.url, rollout_id, attempt_id) for rollout_id, attempt_id in rollouts]
    enough, total = asyncio.Event(), [0]
    tasks = [asyncio.create_task(writer.run(enough, total)) for writer in writers]
    await enough.wait()
    assert await server.kill() != 0  # SIGKILL while the writers are still writing
    await asyncio.gather(*tasks)

    restarted = StoreServerProcess(db)
    await restarted.start()
    try:
        async with LightningStoreClient(restarted.url) as store:
            for writer in writers:
                spans = await store.query_spans(writer.rollout_id)
                stored = {span.span_id: span.sequence_id for span in spans}
                for span_id, sequence_id in writer.acknowledged.items():
                    assert stored.get(span_id) == sequence_id, f"acknowledged span {span_id} lost or renumbered"
                assert len(set(stored.values())) == len(stored), "sequence ids must be unique"
                per_batch = Counter(span.attributes["batch"] for span in spans)
                assert set(per_batch.values()) <= {BATCH}, f"a span batch was half-written: {per_batch}"

                rollout = await store.get_rollout_by_id(writer.rollout_id)
                assert rollout is not None
                assert rollout.metadata is not None and rollout.metadata["step"] >= writer.last_metadata_step
                attempt = await store.get_latest_attempt(writer.rollout_id)
                assert attempt is not None and attempt.attempt_id == writer.attempt_id
                assert (rollout.status, attempt.status) == ("running", "running")
                assert all(span.attributes["agl.prompt_token_ids"] == list(range(64)) for span in spans)
            # The restarted store keeps issuing sequence numbers past everything stored.
            rollout_id, attempt_id = rollouts[0]
            highest = max(span.sequence_id or 0 for span in await store.query_spans(rollout_id))
            assert await store.get_next_span_sequence_id(rollout_id, attempt_id) > highest
    finally:
        await restarted.stop()
