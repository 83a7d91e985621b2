"""Span export: never in the call's way, survives a store outage, counts what it drops."""

from __future__ import annotations

import asyncio

from agl_proxy.exporter import SpanExporter
from agl_proxy.spans import CallRecord

from .conftest import chat_body
from .helpers import wait_for_spans


async def test_calls_succeed_while_the_store_is_down_and_spans_arrive_after(new_rollout, proxy, store, http) -> None:
    rollout_id, attempt_id = ids = await new_rollout()
    base = proxy.as_resource().get_base_url(*ids)
    assert (await http.post(base + "/chat/completions", json=chat_body())).status_code == 200
    await wait_for_spans(store, rollout_id, 1)

    store.down = True
    for _ in range(3):
        assert (await http.post(base + "/chat/completions", json=chat_body())).status_code == 200
    while proxy.gateway.exporter.failed_attempts == 0:
        await asyncio.sleep(0.02)
    assert proxy.gateway.exporter.buffered == 3
    store.down = False

    spans = await wait_for_spans(store, rollout_id, 4)
    assert len(spans) == 4 and all(s.attempt_id == attempt_id for s in spans)
    assert [s.sequence_id for s in spans] == [1, 2, 3, 4]
    assert proxy.gateway.exporter.dropped == 0
    metrics = (await http.get(proxy.url + "/metrics")).text
    assert "agl_proxy_spans_exported_total 4" in metrics and "agl_proxy_span_export_failures_total" in metrics


async def test_sequence_ids_follow_call_order(new_rollout, proxy, store, http) -> None:
    rollout_id, _ = ids = await new_rollout()
    base = proxy.as_resource().get_base_url(*ids)
    for _ in range(5):
        await http.post(base + "/chat/completions", json=chat_body())
    spans = await wait_for_spans(store, rollout_id, 5)
    assert [s.sequence_id for s in spans] == [1, 2, 3, 4, 5]
    assert [s.start_time for s in spans] == sorted(s.start_time for s in spans)


async def test_full_buffer_drops_the_oldest_and_counts(new_rollout, store) -> None:
    rollout_id, attempt_id = await new_rollout()
    store.down = True
    exporter = SpanExporter(store, max_buffer=2)
    await exporter.start()
    for i in range(4):
        exporter.submit(CallRecord("chat", rollout_id, attempt_id, "m", False, start_time=float(i)))
    assert exporter.dropped == 2 and exporter.buffered <= 2
    store.down = False
    assert await exporter.flush(timeout=30)
    await exporter.stop()
    spans = await store.query_spans(rollout_id)
    assert [s.start_time for s in spans] == [2.0, 3.0]


async def test_spans_of_unknown_rollouts_are_dropped_without_blocking_others(new_rollout, store) -> None:
    rollout_id, attempt_id = await new_rollout()
    exporter = SpanExporter(store)
    await exporter.start()
    exporter.submit(CallRecord("chat", "ro-nobody", "at-nobody", "m", False, start_time=1.0))
    exporter.submit(CallRecord("chat", rollout_id, attempt_id, "m", False, start_time=2.0))
    exporter.submit(CallRecord("chat", "", "", "m", False, start_time=3.0))
    assert await exporter.flush(timeout=30)
    await exporter.stop()
    assert exporter.dropped == 1 and exporter.exported == 2
    assert len(await store.query_spans(rollout_id)) == 1
    assert len(await store.query_spans("")) == 1
