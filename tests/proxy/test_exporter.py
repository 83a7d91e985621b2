"""Span export: never in the call's way, survives a store outage, and never drops the span of an
answered call: when the store falls behind, new calls wait for room or are refused instead."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agl_proxy.recording.call_record import CallRecord
from agl_proxy.recording.exporter import SpanExporter

from .conftest import chat_body
from .helpers import FlakyStore, model_entry, wait_for_spans


async def test_calls_succeed_while_the_store_is_down_and_spans_arrive_after(new_rollout, proxy, store, http) -> None:
    rollout_id, attempt_id = ids = await new_rollout()
    base = proxy.as_resource().get_base_url(*ids)
    assert (await http.post(base + "/chat/completions", json=chat_body())).status_code == 200
    await wait_for_spans(store, rollout_id, 1)

    store.down = True
    for _ in range(3):
        assert (await http.post(base + "/chat/completions", json=chat_body())).status_code == 200
    while proxy.state.exporter.failed_attempts == 0:
        await asyncio.sleep(0.02)
    assert proxy.state.exporter.buffered == 3
    store.down = False

    spans = await wait_for_spans(store, rollout_id, 4)
    assert len(spans) == 4 and all(s.attempt_id == attempt_id for s in spans)
    assert [s.sequence_id for s in spans] == [1, 2, 3, 4]
    assert proxy.state.exporter.rejected == 0
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


class SlowNumbers(FlakyStore):
    """The shared store, as seen by a proxy whose sequence-number requests take `delay_s` to come back."""

    def __init__(self, inner: FlakyStore, delay_s: float) -> None:
        super().__init__(inner)
        self.delay_s = delay_s

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[tuple[str, str]]) -> Sequence[int]:
        await asyncio.sleep(self.delay_s)
        return await super().get_many_span_sequence_ids(rollout_attempt_ids)


async def test_a_call_made_after_an_answer_numbers_after_it_on_another_proxy(
    new_rollout, proxy_factory, backend, store, http
) -> None:
    """The first proxy's store replies late; its answer still ends only once the call has its number."""
    rollout_id, _ = ids = await new_rollout()
    slow = await proxy_factory([model_entry("tiny", backend[1])], store=SlowNumbers(store, delay_s=0.3))
    fast = await proxy_factory([model_entry("tiny", backend[1])])
    for proxy in (slow, fast):
        response = await http.post(proxy.as_resource().get_base_url(*ids) + "/chat/completions", json=chat_body())
        assert response.status_code == 200
    spans = await wait_for_spans(store, rollout_id, 2)
    by_start = sorted(spans, key=lambda s: s.start_time)
    assert [s.sequence_id for s in by_start] == [1, 2]


async def test_sustained_load_through_a_small_buffer_loses_no_span(
    new_rollout, proxy_factory, backend, store, http
) -> None:
    proxy = await proxy_factory([model_entry("tiny", backend[1])], max_span_buffer=4, backpressure_wait_s=60)
    exporter = proxy.state.exporter
    rollouts = [await new_rollout() for _ in range(4)]
    answered = {rollout_id: 0 for rollout_id, _ in rollouts}

    async def agent(index: int) -> None:
        ids = rollouts[index % len(rollouts)]
        base = proxy.as_resource().get_base_url(*ids)
        for _ in range(20):
            assert (await http.post(base + "/chat/completions", json=chat_body())).status_code == 200
            answered[ids[0]] += 1

    store.writable.clear()  # the store stalls first: the backlog fills and new calls have to wait
    agents = asyncio.gather(*(agent(i) for i in range(16)))
    while exporter.waited_calls == 0:
        await asyncio.sleep(0.01)
    store.writable.set()
    await agents

    assert await exporter.flush(timeout=30)
    for rollout_id, calls in answered.items():
        spans = await store.query_spans(rollout_id)
        assert [s.sequence_id for s in spans] == list(range(1, calls + 1))
    assert sum(answered.values()) == 16 * 20 == exporter.exported
    metrics = (await http.get(proxy.url + "/metrics")).text
    assert "agl_proxy_backpressure_refusals_total 0" in metrics and "agl_proxy_span_buffer_limit 4" in metrics


async def test_a_stalled_store_gets_new_calls_refused_instead_of_spans_dropped(
    new_rollout, proxy_factory, backend, store, http
) -> None:
    proxy = await proxy_factory([model_entry("tiny", backend[1])], max_span_buffer=2, backpressure_wait_s=0.1)
    exporter = proxy.state.exporter
    rollout_id, _ = ids = await new_rollout()
    base = proxy.as_resource().get_base_url(*ids)
    store.writable.clear()
    for _ in range(2):
        assert (await http.post(base + "/chat/completions", json=chat_body())).status_code == 200
    while exporter.buffered < 2:  # the second call's span is queued just after its answer
        await asyncio.sleep(0.01)

    refused = await http.post(base + "/chat/completions", json=chat_body())
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "span_backlog" and "2 span(s)" in error["message"]
    metrics = (await http.get(proxy.url + "/metrics")).text
    assert "agl_proxy_spans_buffered 2" in metrics and "agl_proxy_backpressure_refusals_total 1" in metrics

    store.writable.set()
    spans = await wait_for_spans(store, rollout_id, 2)
    assert [s.sequence_id for s in spans] == [1, 2]
    assert (await http.post(base + "/chat/completions", json=chat_body())).status_code == 200
    spans = await wait_for_spans(store, rollout_id, 3)
    assert [s.sequence_id for s in spans] == [1, 2, 3]


async def test_stop_writes_every_span_a_slow_store_takes(new_rollout, store) -> None:
    rollout_id, attempt_id = await new_rollout()
    exporter = SpanExporter(store, batch_size=2)
    await exporter.start()
    store.writable.clear()
    for i in range(5):
        exporter.submit(CallRecord("chat", rollout_id, attempt_id, "m", False, start_time=float(i)))
    stopping = asyncio.create_task(exporter.stop())
    await asyncio.sleep(0.1)
    assert not stopping.done()  # stop waits for the store rather than giving the spans up
    store.writable.set()
    await stopping
    spans = await store.query_spans(rollout_id)
    assert [s.start_time for s in spans] == [0.0, 1.0, 2.0, 3.0, 4.0]


async def test_stop_gives_up_only_on_a_store_that_accepts_nothing(new_rollout, store, caplog) -> None:
    rollout_id, attempt_id = await new_rollout()
    exporter = SpanExporter(store)
    await exporter.start()
    store.down = True
    exporter.submit(CallRecord("chat", rollout_id, attempt_id, "m", False, start_time=1.0))
    await exporter.stop(stall_timeout=0.3)
    assert "stopped with 1 span(s) unwritten: the store accepted none for 0.3 s" in caplog.text


async def test_spans_of_unknown_rollouts_are_rejected_without_blocking_others(new_rollout, store) -> None:
    rollout_id, attempt_id = await new_rollout()
    exporter = SpanExporter(store)
    await exporter.start()
    exporter.submit(CallRecord("chat", "ro-nobody", "at-nobody", "m", False, start_time=1.0))
    exporter.submit(CallRecord("chat", rollout_id, attempt_id, "m", False, start_time=2.0))
    exporter.submit(CallRecord("chat", "", "", "m", False, start_time=3.0))
    assert await exporter.flush(timeout=30)
    await exporter.stop()
    assert exporter.rejected == 1 and exporter.exported == 2
    assert len(await store.query_spans(rollout_id)) == 1
    assert len(await store.query_spans("")) == 1
