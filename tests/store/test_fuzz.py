"""Fuzzing the store server: whatever the query string or body, the answer is never a 500,
and the store stays readable. One `agl store serve` subprocess serves the whole module."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agl_store.client import LightningStoreClient
from agl_store.span_wire import PACKED_MEDIA_TYPE

from .http_server import StoreServerProcess

EXAMPLES = 100
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
Server = tuple[StoreServerProcess, dict[str, str]]
"""The served store and the ids of a running rollout, its attempt and a resource set in it."""


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    process = StoreServerProcess(tmp_path_factory.mktemp("fuzz") / "store.db")
    await process.start()
    async with LightningStoreClient(process.url) as store:
        running = await store.start_rollout(input={"q": 1}, worker_id="w")
        ids = {"rollout_id": running.rollout_id, "attempt_id": running.attempt.attempt_id}
        ids["resources_id"] = (await store.add_resources({})).resources_id
    yield process, ids
    await process.stop()


# Values that broke stores before: int64 edges, doubles past them, deep nesting, odd text.
EDGE_INTS = st.sampled_from([0, -1, 1, 2**31, 2**53, 2**53 - 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**63) - 1])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64) + 1, max_value=2**64 - 1),
    EDGE_INTS,
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1.8446744073709552e19, 9.3e18, 1e308, -1e308, 0.5]),
    st.text(max_size=20),
    st.sampled_from(["", "latest", "queuing", "succeeded", "running", "asc", "desc", "and", "or", "train", "\x00"]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
)


def nest(depth: int, leaf: Any, shape: str) -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if shape == "list" or (shape == "mixed" and level % 2) else {"a": value}
    return value


DEPTHS = st.sampled_from([120, 127, 128, 129, 200, 253, 254, 255, 600])
SHAPES = st.sampled_from(["dict", "list", "mixed"])


VALUES = st.one_of(EDGE_INTS, st.builds(nest, DEPTHS, SCALARS, SHAPES), SCALARS, JSON)
QUERY_VALUES = st.one_of(
    st.text(max_size=20),
    EDGE_INTS.map(str),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "1.5", "-0", "18446744073709551616", "%00", "\ud7ff"]),
)

SPAN_FIELDS = [
    "rollout_id", "attempt_id", "sequence_id", "trace_id", "span_id", "parent_id", "name", "status", "attributes",
    "events", "links", "start_time", "end_time", "context", "parent", "resource",
]  # fmt: skip
PAGE_FIELDS = ["limit", "offset", "sort_by", "sort_order"]
BODY_FIELDS: dict[str, list[str]] = {
    "/v1/agl/queues/rollouts/enqueue": ["rollouts"],
    "/v1/agl/queues/rollouts/dequeue": ["limit", "worker_id"],
    "/v1/agl/rollouts": ["input", "mode", "resources_id", "config", "metadata", "worker_id"],
    "/v1/agl/rollouts/search": [*PAGE_FIELDS, "status_in", "rollout_id_in", "rollout_id_contains", "mode",
                                "start_time_after", "start_time_before", "filter_logic"],
    "/v1/agl/rollouts/delete": ["rollout_ids"],
    "/v1/agl/rollouts/expire": ["older_than_seconds"],
    "/v1/agl/rollouts/{rollout_id}": ["input", "mode", "resources_id", "status", "config", "metadata"],
    "/v1/agl/rollouts/{rollout_id}/attempts": ["worker_id"],
    "/v1/agl/rollouts/{rollout_id}/attempts/search": PAGE_FIELDS,
    "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}": ["status", "worker_id", "last_heartbeat_time", "metadata"],
    "/v1/agl/spans": SPAN_FIELDS,
    "/v1/agl/spans/search": [*PAGE_FIELDS, "rollout_id", "attempt_id", "name", "name_contains", "filter_logic"],
    "/v1/agl/spans/next": ["rollout_id", "attempt_id"],
    "/v1/agl/spans/next/many": ["rollout_attempt_ids"],
    "/v1/agl/resources": ["llm", "prompt"],
    "/v1/agl/resources/{resources_id}": ["llm", "prompt"],
    "/v1/agl/workers/search": [*PAGE_FIELDS, "status_in", "worker_id_contains", "filter_logic"],
    "/v1/agl/workers/{worker_id}": ["heartbeat_stats"],
    "/v1/agl/waits/rollouts": ["rollout_ids"],
}  # fmt: skip
QUERY_FIELDS: dict[str, list[str]] = {
    "/v1/agl/rollouts": [*PAGE_FIELDS, "status_in", "rollout_id_in", "mode", "start_time_after", "filter_logic"],
    "/v1/agl/rollouts/{rollout_id}/attempts": PAGE_FIELDS,
    "/v1/agl/spans": [*PAGE_FIELDS, "rollout_id", "attempt_id", "trace_id", "name_contains", "filter_logic"],
    "/v1/agl/resources": [*PAGE_FIELDS, "resources_id", "resources_id_contains"],
    "/v1/agl/workers": [*PAGE_FIELDS, "status_in", "worker_id_contains"],
    "/v1/agl/rollouts/{rollout_id}": [],
    "/v1/agl/rollouts/{rollout_id}/attempts/latest": [],
    "/v1/agl/workers/{worker_id}": [],
    "/v1/agl/resources/{resources_id}": [],
    "/v1/agl/statistics": [],
}


def a_span_like(ids: dict[str, str]) -> st.SearchStrategy[dict[str, Any]]:
    """A span body that is valid but for the fields the draw replaces."""
    base = {**{key: ids[key] for key in ("rollout_id", "attempt_id")}, "name": "fuzz"}
    drawn = st.fixed_dictionaries({}, optional={field: VALUES for field in SPAN_FIELDS})
    return drawn.map(lambda extra: {**base, **extra})


def body_for(path: str, ids: dict[str, str]) -> st.SearchStrategy[Any]:
    if path == "/v1/agl/spans":
        return st.one_of(a_span_like(ids), JSON)
    if path == "/v1/agl/waits/rollouts":  # a long poll: only timeouts that end at once
        return st.fixed_dictionaries(
            {"timeout": st.sampled_from([0, 0.001, -1, "x", -1e308, [1]])},
            optional={"rollout_ids": st.one_of(st.lists(st.text(max_size=5), max_size=3), VALUES)},
        )
    fields = BODY_FIELDS[path]
    return st.one_of(st.fixed_dictionaries({}, optional={field: VALUES for field in fields}), JSON)


def otlp_body(ids: dict[str, str]) -> st.SearchStrategy[Any]:
    """OTLP/JSON export requests whose attribute values are drawn."""
    any_value = st.one_of(
        st.builds(lambda v: {"intValue": v}, st.one_of(EDGE_INTS, EDGE_INTS.map(str), st.text(max_size=5))),
        st.builds(lambda v: {"doubleValue": v}, st.one_of(st.floats(allow_nan=False, allow_infinity=False), SCALARS)),
        st.builds(lambda v: {"stringValue": v}, SCALARS),
        st.builds(lambda v: {"kvlistValue": {"values": [{"key": "k", "value": v}]}}, st.just({"intValue": 1})),
        VALUES,
    )
    attribute = st.builds(lambda key, value: {"key": key, "value": value}, st.sampled_from(["agl.sequence_id",
                          "agentlightning.span_sequence_id", "x"]), any_value)  # fmt: skip
    span = st.fixed_dictionaries(
        {
            "traceId": st.sampled_from(["0" * 32, "ab", "zz", ""]),
            "spanId": st.sampled_from(["1" * 16, "", "xyz"]),
            "name": st.text(max_size=5),
            "attributes": st.lists(attribute, max_size=3).map(
                lambda extra: [
                    {"key": "agl.rollout_id", "value": {"stringValue": ids["rollout_id"]}},
                    {"key": "agl.attempt_id", "value": {"stringValue": ids["attempt_id"]}},
                    *extra,
                ]
            ),
        },
        optional={"startTimeUnixNano": VALUES, "endTimeUnixNano": VALUES, "status": VALUES, "events": VALUES},
    )
    return st.one_of(
        st.builds(lambda spans: {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}, st.lists(span, max_size=2)),
        JSON,
    )


def with_ids(path: str, ids: dict[str, str]) -> str:
    return path.format(worker_id="w", **ids)


async def post_leaves_the_store_readable(
    server: Server, path: str, content: bytes, content_type: str = "application/json"
) -> None:
    """POST `content`: no 500, and listing rollouts and reading spans still answer 200."""
    process, ids = server
    async with httpx.AsyncClient(base_url=process.url, timeout=30) as http:
        answer = await http.post(path, content=content, headers={"content-type": content_type})
        assert answer.status_code < 500, answer.text
        for read, params in (("/v1/agl/rollouts", {}), ("/v1/agl/spans", {"rollout_id": ids["rollout_id"]})):
            answer = await http.get(read, params=params)
            assert answer.status_code == 200, answer.text


@FUZZ
@given(data=st.data())
async def test_no_body_gets_a_500(server: Server, data: st.DataObject) -> None:
    ids = server[1]
    path = data.draw(st.sampled_from(sorted(BODY_FIELDS)), label="path")
    body = data.draw(body_for(path, ids), label="body")
    await post_leaves_the_store_readable(server, with_ids(path, ids), json.dumps(body, allow_nan=False).encode())


@FUZZ
@given(data=st.data())
async def test_no_trace_export_gets_a_500(server: Server, data: st.DataObject) -> None:
    body = json.dumps(data.draw(otlp_body(server[1]), label="body"), allow_nan=False).encode()
    await post_leaves_the_store_readable(server, "/v1/traces", body)


@FUZZ
@given(data=st.data())
async def test_no_packed_batch_gets_a_500(server: Server, data: st.DataObject) -> None:
    spans = data.draw(st.lists(a_span_like(server[1]), max_size=2), label="spans")
    ranges = data.draw(st.one_of(st.lists(st.one_of(st.none(), st.lists(EDGE_INTS, max_size=3)), max_size=3), VALUES))
    blobs = data.draw(st.binary(max_size=64), label="blobs")
    head = json.dumps({"spans": spans, "packed_tokens": ranges}, allow_nan=False).encode()
    await post_leaves_the_store_readable(server, "/v1/agl/spans/batch/packed", head + b"\n" + blobs, PACKED_MEDIA_TYPE)


@FUZZ
@given(data=st.data())
async def test_no_query_gets_a_500(server: Server, data: st.DataObject) -> None:
    process, ids = server
    path = data.draw(st.sampled_from(sorted(QUERY_FIELDS)), label="path")
    fields = QUERY_FIELDS[path]
    params = data.draw(st.fixed_dictionaries({}, optional={field: QUERY_VALUES for field in fields}), label="params")
    if path == "/v1/agl/spans":
        params.setdefault("rollout_id", ids["rollout_id"])
    async with httpx.AsyncClient(base_url=process.url, timeout=30) as http:
        answer = await http.get(with_ids(path, ids), params=params)
        assert answer.status_code < 500, answer.text


@settings(FUZZ, max_examples=EXAMPLES // 3)
@given(segment=st.text(min_size=1, max_size=12))
async def test_no_path_id_gets_a_500(server: Server, segment: str) -> None:
    process, _ = server
    async with httpx.AsyncClient(base_url=process.url, timeout=30) as http:
        for template in ("/v1/agl/rollouts/{}", "/v1/agl/rollouts/{}/attempts/latest", "/v1/agl/workers/{}"):
            answer = await http.get(template.format(quote(segment, safe="")))
            assert answer.status_code < 500, answer.text
