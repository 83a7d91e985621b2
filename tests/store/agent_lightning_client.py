"""Drive `agl store serve` with agent-lightning 0.3's own `LightningStoreClient`, as its runners,
tracers and algorithms use it. Run by the peer venv's Python (never agl's), not collected by pytest:

    .cache/peers/agentlightning-0.3/bin/python tests/store/agent_lightning_client.py http://127.0.0.1:PORT

Prints one JSON object of what the client saw; `test_agent_lightning_client.py` compares it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm, imported by agentlightning, stays offline

import aiohttp
from agentlightning.store.client_server import LightningStoreClient
from agentlightning.types import (
    LLM,
    EnqueueRolloutRequest,
    OtelResource,
    PromptTemplate,
    RolloutConfig,
    Span,
    TraceStatus,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def make_span(rollout_id: str, attempt_id: str, sequence_id: int, name: str, span_id: str) -> Span:
    """A span as agent-lightning's tracer builds it: every field given."""
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id=span_id,
        parent_id=None,
        name=name,
        status=TraceStatus(status_code="OK"),
        attributes={"gen_ai.request.model": "m"},
        events=[],
        links=[],
        start_time=1.0,
        end_time=2.0,
        context=None,
        parent=None,
        resource=OtelResource(attributes={}, schema_url=""),
    )


def otel_span(name: str) -> Any:
    """A finished OpenTelemetry SDK span (a `ReadableSpan`), as agent-lightning's tracer exports."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("agent").start_as_current_span(name) as span:
        span.set_attribute("agl.prompt_token_ids", list(range(10)))
    provider.shutdown()
    return exporter.get_finished_spans()[0]


async def http_status(call: Awaitable[Any]) -> int:
    """The HTTP status the client raised for (agent-lightning's client raises aiohttp's error on a 4xx)."""
    try:
        await call
    except aiohttp.ClientResponseError as exc:
        return exc.status
    return 200


async def error_detail(store: LightningStoreClient, path: str, body: dict[str, Any]) -> Any:
    """The error body of a request the client would send, read through the client's own session."""
    session = await store._get_session()
    async with session.post(store.server_address + path, json=body) as response:
        return (await response.json())["detail"]


async def main(url: str) -> dict[str, Any]:
    store = LightningStoreClient(url, retry_delays=(), health_retry_delays=())
    out: dict[str, Any] = {}
    try:
        # --- resources, and the latest of them on enqueue -----------------------------------
        llm = await store.add_resources({"main_llm": LLM(endpoint="http://llm/v1", model="m")})
        templates = [PromptTemplate(template=text, engine="f-string") for text in ("{q}", "Q: {q}")]
        prompt = await store.update_resources("rs-prompt", {"prompt": templates[0]})
        updated = await store.update_resources("rs-prompt", {"prompt": templates[1]})
        out["resources"] = {
            "versions": [llm.version, prompt.version, updated.version],
            "latest": (await store.get_latest_resources()).resources_id,
            "by_id": (await store.get_resources_by_id(llm.resources_id)).resources["main_llm"].endpoint,
            "query_total": (await store.query_resources()).total,
            "missing": await store.get_resources_by_id("rs-missing"),
        }

        # --- the queue --------------------------------------------------------------------
        first = await store.enqueue_rollout(input={"q": "2+2"}, mode="train")
        many = await store.enqueue_many_rollouts(
            [EnqueueRolloutRequest(input=1), EnqueueRolloutRequest(input=2, resources_id=llm.resources_id)]
        )
        names = {llm.resources_id: "llm", prompt.resources_id: "prompt"}
        out["enqueued"] = [(r.status, names[r.resources_id]) for r in (first, *many)]
        claimed = await store.dequeue_rollout(worker_id="w1")
        pair = await store.dequeue_many_rollouts(limit=2, worker_id="w2")
        out["dequeued"] = [claimed.rollout_id == first.rollout_id, [r.attempt.sequence_id for r in pair]]
        out["empty_queue"] = await store.dequeue_rollout(worker_id="w3")

        # --- spans ------------------------------------------------------------------------
        rid, aid = claimed.rollout_id, claimed.attempt.attempt_id
        issued = [
            await store.get_next_span_sequence_id(rid, aid),
            await store.get_next_span_sequence_id(rid, "latest"),
            await store.get_next_span_sequence_id(rid, "at-not-seen-yet"),
        ]
        issued += list(await store.get_many_span_sequence_ids([(rid, aid), (rid, "latest")]))
        out["sequence_ids"] = issued
        added = await store.add_span(make_span(rid, aid, issued[0], "openai.chat", "b7ad6b7169203331"))
        unordered = await store.add_span(make_span(rid, "latest", 0, "reward", "b7ad6b7169203332"))
        tools = [make_span(rid, aid, 9, f"tool-{i}", f"c7ad6b716920333{i}") for i in range(2)]
        batch = await store.add_many_spans(tools)
        otel = await store.add_otel_span(rid, "latest", otel_span("agent.step"))
        duplicate = await store.add_span(make_span(rid, aid, issued[0], "openai.chat", "b7ad6b7169203331"))
        out["spans_added"] = {
            "one": added.sequence_id,
            "latest_with_zero": [unordered.attempt_id == aid, unordered.sequence_id],
            "batch": [s.sequence_id for s in batch],
            "otel": [otel.name, otel.attempt_id == aid, otel.sequence_id, otel.attributes["agl.prompt_token_ids"]],
            "duplicate": duplicate,
        }
        spans = await store.query_spans(rid, "latest")
        out["spans"] = [(s.name, s.sequence_id) for s in spans]
        out["span_page"] = [
            [s.name for s in await store.query_spans(rid, name_contains="tool", sort_by="name", sort_order="desc")],
            (await store.query_spans(rid, limit=2, offset=1)).total,
        ]

        # --- attempts ---------------------------------------------------------------------
        out["null_metadata"] = await http_status(store.update_attempt(rid, aid, metadata=None))
        attempt = await store.update_attempt(rid, "latest", metadata={"gpu": 0}, last_heartbeat_time=5.0)
        out["attempt_update"] = [attempt.metadata, attempt.last_heartbeat_time, attempt.status]
        done = await store.update_attempt(rid, aid, status="succeeded")
        out["succeeded"] = [done.status, (await store.get_rollout_by_id(rid)).status]
        waited = await store.wait_for_rollouts(rollout_ids=[rid, "ro-missing"], timeout=0.1)
        out["waited"] = [r.rollout_id == rid for r in waited]

        # A succeeded rollout run again: a new attempt, and the rollout follows it.
        retried = await store.start_attempt(rid, worker_id="w1")
        out["start_attempt_on_succeeded"] = [retried.status, retried.attempt.sequence_id, retried.end_time is None]
        attempts = await store.query_attempts(rid)
        out["attempts"] = [[a.sequence_id for a in attempts], (await store.get_latest_attempt(rid)).status]

        # A rollout whose only attempt failed, requeued by an algorithm and run again.
        failing = pair[0]
        await store.update_attempt(failing.rollout_id, "latest", status="failed")
        failed = await store.get_rollout_by_id(failing.rollout_id)
        retry_config = RolloutConfig(max_attempts=2)
        requeued = await store.update_rollout(failing.rollout_id, status="requeuing", config=retry_config)
        again = await store.dequeue_rollout(worker_id="w2")
        out["requeue_failed"] = [
            failed.status,
            requeued.status,
            again.rollout_id == failing.rollout_id,
            again.attempt.sequence_id,
        ]

        # --- rollouts -----------------------------------------------------------------------
        started = await store.start_rollout(input="direct", worker_id="w4")
        out["start_rollout"] = [started.status, started.resources_id, started.attempt.sequence_id]
        out["query_rollouts"] = [
            (await store.query_rollouts()).total,
            len(await store.query_rollouts(status_in=["preparing"])),
            [r.rollout_id for r in await store.query_rollouts(rollout_id_in=[rid])] == [rid],
        ]
        out["missing_rollout"] = [
            await store.get_rollout_by_id("ro-missing"),
            await store.get_latest_attempt("ro-missing"),
        ]

        # --- workers ----------------------------------------------------------------------
        worker = await store.update_worker("w1", heartbeat_stats={"load": 1})
        out["workers"] = [
            worker.heartbeat_stats,
            (await store.get_worker_by_id("w3")).status,
            sorted(w.worker_id for w in await store.query_workers()),
            (await store.update_worker("w5")).worker_id,
        ]

        # --- bad requests the way this client reports them ------------------------------------
        no_rollouts = store._request_json("post", "/queues/rollouts/enqueue", json={})
        out["enqueue_without_rollouts"] = await http_status(no_rollouts)
        out["bad_sort_by"] = [
            await http_status(store.query_rollouts(sort_by="nonsense")),
            (await error_detail(store, "/rollouts/search", {"sort_by": "nonsense"})).split(", allowed")[0],
        ]

        stats = await store.statistics()
        out["statistics"] = [stats["total_rollouts"], stats["total_attempts"], stats["total_workers"], stats["name"]]
    finally:
        await store.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
