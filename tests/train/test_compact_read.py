"""The trainer reads calls stored as deltas compactly (`query_spans(..., compact=True)`) and
builds exactly the rows a read of whole spans gives: same ids, same types, same breaks."""

from __future__ import annotations

import random
from pathlib import Path

from agl_store import call_span, reward_span
from agl_store.client import LightningStoreClient
from agl_store.models import TraceStatus
from agl_store.sqlite import SQLiteStore
from agl_train.core.aggregate import Limits, aggregate
from agl_train.core.traces import read_rollout, trace_from_spans

from ..store.http_server import StoreServerProcess
from ..store.test_span_deltas import call, conversation, write

LIMITS = Limits(max_prompt_length=4096, max_response_length=8192)


def typed(rows: list) -> list:
    return [(row, type(row.prompt_ids), type(row.response_ids), type(row.response_mask)) for row in rows]


async def test_rows_from_a_compact_read_equal_rows_from_whole_spans(tmp_path: Path) -> None:
    path = tmp_path / "agl.db"
    written = []
    async with SQLiteStore(path) as store:
        for seed in range(12):
            rid, aid = await write(store, conversation(random.Random(seed), 10), random.Random(seed))
            await store.add_span(reward_span(rid, aid, 1.0))
            written.append(rid)

        for level in ("trajectory", "transition"):
            for rid in written:
                whole = trace_from_spans(rid, await store.query_spans(rid, "latest"), attempt_id="")
                compact = await read_rollout(store, rid)
                assert any(call.extends is not None for call in compact.calls)
                expected = aggregate([whole], level, LIMITS)
                got = aggregate([compact], level, LIMITS)
                assert typed(got.rows) == typed(expected.rows)
                assert got.metrics == expected.metrics
                assert [b.describe() for b in got.breaks] == [b.describe() for b in expected.breaks]

    server = StoreServerProcess(path)
    await server.start()
    try:
        async with LightningStoreClient(server.url, token_arrays=True) as client:
            for rid in written:
                whole = trace_from_spans(rid, await client.query_spans(rid, "latest"), attempt_id="")
                compact = await read_rollout(client, rid)
                assert typed(aggregate([compact], "trajectory", LIMITS).rows) == typed(
                    aggregate([whole], "trajectory", LIMITS).rows
                )
    finally:
        await server.stop()


async def test_a_call_retried_after_a_failed_try_trains_on_its_own_ids(tmp_path: Path) -> None:
    # The proxy cancels a call still running when a weight update starts (an ERROR span, no ids);
    # the client sends the same request again. The retry shares the failed try's messages only.
    messages = [{"role": "user", "content": "Write one short sentence."}]
    failed = call("try-1", [], messages, []).model_copy(update={"status": TraceStatus(status_code="ERROR")})
    del failed.attributes[call_span.PROMPT_TOKEN_IDS], failed.attributes[call_span.CHOICES]
    retried = call("try-2", [11, 12, 13], messages, [[21, 22]])
    async with SQLiteStore(tmp_path / "agl.db") as store:
        attempted = await store.start_rollout({"prompt": "p"})
        ids = {"rollout_id": attempted.rollout_id, "attempt_id": attempted.attempt.attempt_id}
        for sequence_id, span in enumerate([failed, retried], start=1):
            await store.add_span(span.model_copy(update={**ids, "sequence_id": sequence_id}))

        trace = await read_rollout(store, attempted.rollout_id)

    assert trace.skipped == {"error": 1}
    assert [(list(c.prompt_ids), list(c.response_ids)) for c in trace.calls] == [([11, 12, 13], [21, 22])]
