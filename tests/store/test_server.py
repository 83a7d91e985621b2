"""The store server over real HTTP: agent-lightning 0.3 wire compatibility, bad input,
auth and metrics. One `agl store serve` subprocess serves the whole module."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from agl_store.bounds import MAX_JSON_DEPTH
from agl_store.client import LightningStoreClient
from agl_store.models import Span
from agl_store.span_wire import PACKED_MEDIA_TYPE

from .http_server import StoreServerProcess

KEY = "test-key"
JSON = {"content-type": "application/json"}
MAX_BODY_BYTES = 1_000_000


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StoreServerProcess]:
    db = tmp_path_factory.mktemp("server") / "store.db"
    process = StoreServerProcess(db, key=KEY, extra_args=["--max-body-bytes", str(MAX_BODY_BYTES)])
    await process.start()
    yield process
    await process.stop()


@pytest.fixture
async def http(server: StoreServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    """A raw HTTP client with the key, for sending exact bodies."""
    async with httpx.AsyncClient(base_url=server.url + "/v1/agl", headers={"authorization": f"Bearer {KEY}"}) as client:
        yield client


@pytest.fixture
async def store(server: StoreServerProcess) -> AsyncIterator[LightningStoreClient]:
    async with LightningStoreClient(server.url, key=KEY) as client:
        yield client


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert body["detail"] == body["error"]["message"]  # agent-lightning clients read `detail`
    return dict(body["error"])


# --- agent-lightning 0.3 wire compatibility: the bodies its LightningStoreClient sends ------


async def test_agent_lightning_rollout_lifecycle(http: httpx.AsyncClient) -> None:
    enqueued = await http.post(
        "/queues/rollouts/enqueue",
        json={
            "rollouts": [
                {"input": {"q": "2+2"}, "mode": "train", "resources_id": None, "config": None, "metadata": None}
            ]
        },
    )
    assert enqueued.status_code == 201
    (rollout,) = enqueued.json()
    assert rollout["status"] == "queuing" and rollout["input"] == {"q": "2+2"}

    dequeued = await http.post("/queues/rollouts/dequeue", json={"limit": 1, "worker_id": "worker-1"})
    assert dequeued.status_code == 200
    claimed = next(item for item in dequeued.json() if item["rollout_id"] == rollout["rollout_id"])
    attempt = claimed["attempt"]
    assert attempt["sequence_id"] == 1 and attempt["worker_id"] == "worker-1"

    rollout_id, attempt_id = rollout["rollout_id"], attempt["attempt_id"]
    issued = await http.post("/spans/next", json={"rollout_id": rollout_id, "attempt_id": attempt_id})
    assert issued.status_code == 200 and issued.json()["sequence_id"] >= 1

    span = {
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "sequence_id": issued.json()["sequence_id"],
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "span_id": "b7ad6b7169203331",
        "parent_id": None,
        "name": "openai.chat",
        "status": {"status_code": "OK", "description": None},
        "attributes": {"gen_ai.request.model": "m"},
        "events": [],
        "links": [],
        "start_time": 1.0,
        "end_time": 2.0,
        "context": {
            "trace_id": "0af7651916cd43dd8448eb211c80319c",
            "span_id": "b7ad6b7169203331",
            "is_remote": False,
            "trace_state": {},
        },
        "parent": None,
        "resource": {"attributes": {"service.name": "agent"}, "schema_url": ""},
    }
    added = await http.post("/spans", json=span)
    assert added.status_code == 201 and added.json()["sequence_id"] == span["sequence_id"]

    spans = await http.post(
        "/spans/search",
        json={
            "rollout_id": rollout_id,
            "limit": -1,
            "offset": 0,
            "attempt_id": attempt_id,
            "filter_logic": "and",
            "sort_by": "sequence_id",
            "sort_order": "asc",
        },
    )
    page = spans.json()
    assert (page["total"], page["limit"], page["offset"]) == (1, -1, 0)
    assert page["items"][0]["span_id"] == "b7ad6b7169203331"

    latest = await http.get(f"/rollouts/{rollout_id}/attempts/latest")
    assert latest.json()["attempt_id"] == attempt_id and latest.json()["status"] == "running"

    attempts = await http.post(
        f"/rollouts/{rollout_id}/attempts/search",
        json={"limit": -1, "offset": 0, "sort_by": "sequence_id", "sort_order": "asc"},
    )
    assert [a["attempt_id"] for a in attempts.json()["items"]] == [attempt_id]

    done = await http.post(f"/rollouts/{rollout_id}/attempts/{attempt_id}", json={"status": "succeeded"})
    assert done.status_code == 200 and done.json()["status"] == "succeeded"

    waited = await http.post("/waits/rollouts", json={"rollout_ids": [rollout_id], "timeout": 0.1})
    assert [r["status"] for r in waited.json()] == ["succeeded"]

    found = await http.post(
        "/rollouts/search", json={"limit": -1, "offset": 0, "rollout_id_in": [rollout_id], "filter_logic": "and"}
    )
    assert found.json()["total"] == 1 and found.json()["items"][0]["attempt"]["status"] == "succeeded"


async def test_agent_lightning_start_rollout_resources_and_workers(http: httpx.AsyncClient) -> None:
    resources = await http.post(
        "/resources",
        json={
            "main_llm": {
                "resource_type": "llm",
                "endpoint": "http://llm/v1",
                "model": "m",
                "api_key": None,
                "sampling_parameters": {"temperature": 0.7},
            }
        },
    )
    assert resources.status_code == 201
    resources_id = resources.json()["resources_id"]
    assert (await http.get("/resources/latest")).json()["resources_id"] == resources_id
    listed = await http.get("/resources", params=[("limit", -1), ("offset", 0), ("resources_id", resources_id)])
    assert [r["resources_id"] for r in listed.json()["items"]] == [resources_id]

    started = await http.post(
        "/rollouts",
        json={
            "input": "task",
            "mode": None,
            "resources_id": None,
            "config": None,
            "metadata": None,
            "worker_id": "w-2",
        },
    )
    assert started.status_code == 201
    assert started.json()["status"] == "preparing" and started.json()["resources_id"] == resources_id

    retried = await http.post(f"/rollouts/{started.json()['rollout_id']}/attempts", json={"worker_id": "w-2"})
    assert retried.status_code == 201 and retried.json()["attempt"]["sequence_id"] == 2

    worker = await http.post("/workers/w-9", json={"heartbeat_stats": {"gpu": 0.5}})
    assert worker.status_code == 200 and worker.json()["heartbeat_stats"] == {"gpu": 0.5}
    assert (await http.get("/workers/w-9")).json()["worker_id"] == "w-9"
    searched = await http.post("/workers/search", json={"worker_id_contains": "w-9", "filter_logic": "and"})
    assert searched.json()["total"] == 1

    stats = (await http.get("/statistics")).json()
    assert stats["total_rollouts"] >= 1 and "rollouts_by_status" in stats


async def test_agent_lightning_attempt_ids_latest_and_unknown(http: httpx.AsyncClient) -> None:
    started = (await http.post("/rollouts", json={"input": "task"})).json()
    rollout_id, attempt_id = started["rollout_id"], started["attempt"]["attempt_id"]

    issued = [
        await http.post("/spans/next", json={"rollout_id": rollout_id, "attempt_id": asked})
        for asked in ("latest", "at-not-seen-yet", attempt_id)
    ]
    assert [(a.status_code, a.json()) for a in issued] == [(200, {"sequence_id": n}) for n in (1, 2, 3)]

    span = {"rollout_id": rollout_id, "attempt_id": "latest", "sequence_id": 0, "name": "reward"}
    added = await http.post("/spans", json=span)
    assert added.status_code == 201
    assert (added.json()["attempt_id"], added.json()["sequence_id"]) == (attempt_id, 0)
    batch = await http.post("/spans/batch", json=[{**span, "span_id": "00000000000000b2", "sequence_id": None}])
    assert batch.json() == {"stored": [{"index": 0, "sequence_id": 4, "attempt_id": attempt_id}]}
    missing = await http.post("/spans/next", json={"rollout_id": "ro-missing", "attempt_id": "latest"})
    assert missing.status_code == 404 and "ro-missing" in error_of(missing)["message"]


async def test_agent_lightning_null_attempt_metadata_is_refused(http: httpx.AsyncClient) -> None:
    started = (await http.post("/rollouts", json={"input": "task"})).json()
    path = f"/rollouts/{started['rollout_id']}/attempts/latest"

    answer = await http.post(path, json={"metadata": None})

    assert answer.status_code == 400
    assert error_of(answer)["message"] == "metadata is invalid; it cannot be a null value."
    assert (await http.post(path, json={"metadata": {"k": 1}})).json()["metadata"] == {"k": 1}


async def test_agent_lightning_waits_skip_unknown_ids(http: httpx.AsyncClient) -> None:
    started = (await http.post("/rollouts", json={"input": "task"})).json()
    await http.post(f"/rollouts/{started['rollout_id']}", json={"status": "succeeded"})

    waited = await http.post("/waits/rollouts", json={"rollout_ids": ["ro-missing", started["rollout_id"]]})

    assert waited.status_code == 200
    assert [r["rollout_id"] for r in waited.json()] == [started["rollout_id"]]


async def test_missing_objects_read_as_null_like_agent_lightning(http: httpx.AsyncClient) -> None:
    for path in ("/rollouts/ro-missing", "/resources/rs-missing", "/workers/w-missing"):
        answer = await http.get(path)
        assert (answer.status_code, answer.json()) == (200, None)
    assert (await http.post("/queues/rollouts/dequeue", json={"limit": 0})).json() == []


# --- bad input: the right 4xx, a message naming the problem, and the store unchanged --------


async def unchanged_after(
    store: LightningStoreClient, http: httpx.AsyncClient, method: str, path: str, **request: Any
) -> httpx.Response:
    before = (await store.statistics()).model_dump(exclude={"uptime", "database_bytes"})
    answer = await http.request(method, path, **request)
    after = (await store.statistics()).model_dump(exclude={"uptime", "database_bytes"})
    assert after == before
    return answer


@pytest.mark.parametrize(
    ("method", "path", "request_args", "status", "code", "message"),
    [
        (
            "POST",
            "/spans",
            {"content": b'{"rollout_id": "r",', "headers": JSON},
            400,
            "invalid_input",
            "malformed JSON body",
        ),
        # A body or query that does not fit the route's schema: 422, as agent-lightning 0.3's FastAPI answers.
        ("POST", "/queues/rollouts/enqueue", {"json": {}}, 422, "validation_error", "rollouts: Field required"),
        (
            "POST",
            "/queues/rollouts/enqueue",
            {"json": {"rollouts": "x"}},
            422,
            "validation_error",
            "rollouts: Input should be a valid list",
        ),
        (
            "POST",
            "/queues/rollouts/enqueue",
            {"json": {"rollouts": [{"input": 1, "mode": "play"}]}},
            422,
            "validation_error",
            "rollouts.0.mode",
        ),
        ("POST", "/queues/rollouts/enqueue", {"content": b""}, 422, "validation_error", "request body is empty"),
        (
            "POST",
            "/spans",
            {"json": {"rollout_id": "r", "attempt_id": "a"}},
            422,
            "validation_error",
            "name: Field required",
        ),
        (
            "POST",
            "/spans/batch",
            {"json": [{"rollout_id": "r", "attempt_id": "a", "name": "ok"}, {"rollout_id": "r"}]},
            422,
            "validation_error",
            "1.attempt_id",
        ),
        ("GET", "/rollouts", {"params": {"status_in": "finished"}}, 422, "validation_error", "status_in.0"),
        (
            "POST",
            "/waits/rollouts",
            {"json": {"rollout_ids": ["x"], "timeout": -1}},
            422,
            "validation_error",
            "timeout",
        ),
        # Values agent-lightning 0.3's server itself refuses with a 400, in its words.
        ("POST", "/rollouts/search", {"json": {"limit": 0}}, 400, "invalid_input", "limit must be greater than 0"),
        (
            "POST",
            "/rollouts/search",
            {"json": {"sort_by": "nonsense"}},
            400,
            "invalid_input",
            "Invalid sort_by: nonsense, allowed fields are: rollout_id, input, start_time",
        ),
        ("POST", "/rollouts/ro-missing", {"json": {"status": "running"}}, 404, "not_found", "ro-missing"),
        ("GET", "/rollouts/ro-missing/attempts/latest", {}, 404, "not_found", "ro-missing"),
        (
            "POST",
            "/spans/next",
            {"json": {"rollout_id": "ro-missing", "attempt_id": "at-x"}},
            404,
            "not_found",
            "ro-missing",
        ),
        (
            "POST",
            "/spans",
            {"content": b"x" * (MAX_BODY_BYTES + 1), "headers": JSON},
            413,
            "payload_too_large",
            "over the limit",
        ),
        # Integers SQLite's signed 64-bit INTEGER cannot hold were a 500 OverflowError.
        ("GET", "/rollouts", {"params": {"limit": str(2**63)}}, 400, "invalid_input", "limit must be at most"),
        ("GET", "/spans", {"params": {"rollout_id": "r", "offset": str(2**63)}}, 400, "invalid_input", "offset"),
        ("POST", "/queues/rollouts/dequeue", {"json": {"limit": 2**63}}, 400, "invalid_input", "limit"),
        ("POST", "/rollouts/search", {"json": {"offset": 2**64 - 1}}, 400, "invalid_input", "offset must be at most"),
        (
            "POST",
            "/spans",
            {"json": {"rollout_id": "r", "attempt_id": "a", "name": "n", "sequence_id": 2**63}},
            400,
            "invalid_input",
            "sequence_id must be at most 9007199254740991",
        ),
    ],
)
async def test_bad_requests(
    store: LightningStoreClient,
    http: httpx.AsyncClient,
    method: str,
    path: str,
    request_args: dict[str, Any],
    status: int,
    code: str,
    message: str,
) -> None:
    answer = await unchanged_after(store, http, method, path, **request_args)
    assert answer.status_code == status, answer.text
    error = error_of(answer)
    assert error["code"] == code
    assert message in error["message"]


def nested_json(depth: int, leaf: bytes = b"1") -> bytes:
    return b'{"a":' * depth + leaf + b"}" * depth


async def test_json_too_deep_to_read_back_is_refused_and_reads_keep_working(
    store: LightningStoreClient, http: httpx.AsyncClient
) -> None:
    # 254 levels went in but no response could hold them: listing rollouts answered 500, and
    # a dequeue claimed the rollout while answering 500. 1000 levels was a RecursionError.
    rollout = await store.start_rollout(input=1)
    span_head = orjson.dumps({"rollout_id": rollout.rollout_id, "attempt_id": rollout.attempt.attempt_id, "name": "n"})
    packed_tail = b'],"packed_tokens":[null]}\n'
    for depth in (254, 1000):
        cases = [
            ("/queues/rollouts/enqueue", b'{"rollouts": [{"input": ' + nested_json(depth) + b"}]}", "input"),
            (f"/rollouts/{rollout.rollout_id}", b'{"metadata": ' + nested_json(depth) + b"}", "metadata"),
            ("/spans", span_head[:-1] + b',"attributes":' + nested_json(depth) + b"}", "attributes"),
            (
                "/spans/batch/packed",
                b'{"spans":[' + span_head[:-1] + b',"attributes":' + nested_json(depth) + b"}" + packed_tail,
                "spans[0].attributes",
            ),
        ]
        for path, body, field in cases:
            headers = {"content-type": PACKED_MEDIA_TYPE} if path.endswith("/packed") else JSON
            answer = await unchanged_after(store, http, "POST", path, content=body, headers=headers)
            assert answer.status_code == 400, (path, depth, answer.text)
            assert f"{field} nests deeper than {MAX_JSON_DEPTH} levels" in error_of(answer)["message"]
    assert (await http.get("/rollouts")).status_code == 200
    assert (await http.post("/queues/rollouts/dequeue", json={"limit": 100})).status_code == 200
    assert (await http.get("/spans", params={"rollout_id": rollout.rollout_id})).status_code == 200


async def test_json_at_the_depth_limit_reads_back_as_plain_json(
    store: LightningStoreClient, http: httpx.AsyncClient
) -> None:
    rollout = await store.start_rollout(input=1)
    attributes = b'{"x":' + nested_json(MAX_JSON_DEPTH - 2, b"[1,2,3,4,5,6,7,8]") + b"}"  # token ids, deepest
    span = orjson.dumps({"rollout_id": rollout.rollout_id, "attempt_id": rollout.attempt.attempt_id, "name": "n"})
    stored = await http.post("/spans", content=span[:-1] + b',"attributes":' + attributes + b"}", headers=JSON)
    assert stored.status_code == 201
    page = await http.get("/spans", params={"rollout_id": rollout.rollout_id})  # as agent-lightning 0.3 reads
    assert page.status_code == 200
    assert page.json()["items"][0]["attributes"] == orjson.loads(attributes)


async def test_an_oversized_chunked_body_is_refused_while_it_is_read(
    store: LightningStoreClient, http: httpx.AsyncClient
) -> None:
    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the server must count
        for _ in range(MAX_BODY_BYTES // 10_000 + 2):
            yield b"x" * 10_000

    answer = await unchanged_after(store, http, "POST", "/spans/batch", content=chunks(), headers=JSON)
    assert answer.status_code == 413
    assert "over the limit" in error_of(answer)["message"]


async def test_bad_status_values_name_the_field_and_change_nothing(
    store: LightningStoreClient, http: httpx.AsyncClient
) -> None:
    rollout = await store.enqueue_rollout(input={"x": 1})
    for body, status, message in (
        ({"status": "finished"}, 422, "status: Input should be"),
        ({"status": None}, 400, "status is invalid; it cannot be a null value."),
    ):
        answer = await unchanged_after(store, http, "POST", f"/rollouts/{rollout.rollout_id}", json=body)
        assert answer.status_code == status
        assert message in error_of(answer)["message"]
    assert (await store.get_rollout_by_id(rollout.rollout_id)) == rollout


async def test_a_running_rollout_is_not_deleted(store: LightningStoreClient, http: httpx.AsyncClient) -> None:
    running = await store.start_rollout(input=1)
    answer = await unchanged_after(store, http, "POST", "/rollouts/delete", json={"rollout_ids": [running.rollout_id]})
    assert answer.status_code == 409 and error_of(answer)["code"] == "conflict"
    await store.update_rollout(running.rollout_id, status="cancelled")
    assert (await http.post("/rollouts/delete", json={"rollout_ids": [running.rollout_id]})).json() == {"deleted": 1}
    assert await store.get_rollout_by_id(running.rollout_id) is None


async def test_unknown_routes_and_methods_answer_in_the_error_shape(http: httpx.AsyncClient) -> None:
    missing = await http.get("/no/such/thing")
    assert missing.status_code == 404 and error_of(missing)["code"] == "no_such_route"
    wrong = await http.delete("/statistics")
    assert wrong.status_code == 405 and error_of(wrong)["code"] == "method_not_allowed"
    assert "GET" in wrong.headers["allow"]


# --- auth -------------------------------------------------------------------------------


async def test_the_bearer_key_guards_everything_but_health(server: StoreServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url) as anonymous:
        missing = await anonymous.get("/v1/agl/statistics")
        assert missing.status_code == 401 and "missing bearer key" in error_of(missing)["message"]
        wrong = await anonymous.get("/v1/agl/statistics", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "wrong bearer key" in error_of(wrong)["message"]
        for path in ("/health", "/v1/agl/health"):
            assert (await anonymous.get(path)).json() == {"status": "ok"}
        assert (await anonymous.post("/v1/traces", content=b"")).status_code == 401
        good = await anonymous.get("/v1/agl/statistics", headers={"authorization": f"Bearer {KEY}"})
        assert good.status_code == 200


# --- metrics ----------------------------------------------------------------------------


async def test_metrics_count_requests_per_route_template_spans_and_rollouts(
    server: StoreServerProcess, store: LightningStoreClient, http: httpx.AsyncClient
) -> None:
    attempted = await store.start_rollout(input={"m": 1})
    await store.get_rollout_by_id(attempted.rollout_id)
    await store.add_many_spans(
        [Span(rollout_id=attempted.rollout_id, attempt_id=attempted.attempt.attempt_id, name=f"s{i}") for i in range(3)]
    )
    page = await http.get(server.url + "/metrics")  # at the root, not under /v1/agl
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/plain")
    text = page.text
    assert 'agl_store_http_requests_total{route="/v1/agl/rollouts/{rollout_id}",method="GET",status="200"}' in text
    assert attempted.rollout_id not in text  # ids never become label values
    assert 'agl_store_http_request_duration_seconds_bucket{route="/v1/agl/spans/batch",method="POST",le="+Inf"}' in text
    ingested = next(line for line in text.splitlines() if line.startswith("agl_store_spans_ingested_total "))
    assert int(ingested.split()[1]) >= 3
    assert 'agl_store_rollouts{status="running"}' in text
    size = next(line for line in text.splitlines() if line.startswith("agl_store_database_bytes "))
    assert float(size.split()[1]) > 0


def test_a_broken_pages_plugin_is_skipped_not_fatal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from agl_store.base import LightningStore
    from agl_store.server import app as app_module
    from agl_store.server import pages as pages_module

    class BrokenEntryPoint:
        name = "broken"

        def load(self) -> object:
            raise ImportError("No module named 'missing_view'")

    monkeypatch.setattr(pages_module, "entry_points", lambda group: [BrokenEntryPoint()])
    app = app_module.create_app(LightningStore(), key="k")
    assert app.state.open_paths == frozenset({"/health", "/v1/agl/health"})
    assert "store pages 'broken' skipped: No module named 'missing_view'" in caplog.text


def test_a_pages_plugin_must_return_the_declared_store_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    from agl_store.base import LightningStore
    from agl_store.server import StorePages, create_app
    from agl_store.server import pages as pages_module

    class EntryPoint:
        def __init__(self, name: str, pages: object) -> None:
            self.name, self.pages = name, pages

        def load(self) -> object:
            return lambda settings: self.pages

    shell = StorePages(routes=[], open_paths=frozenset({"/shell"}))
    monkeypatch.setattr(pages_module, "entry_points", lambda group: [EntryPoint("good", shell)])
    assert "/shell" in create_app(LightningStore()).state.open_paths

    untyped = {"routes": [], "open_paths": ["/x"]}
    monkeypatch.setattr(pages_module, "entry_points", lambda group: [EntryPoint("loose", untyped)])
    with pytest.raises(TypeError, match="store pages 'loose' returned dict, not StorePages"):
        create_app(LightningStore())


async def test_the_bearer_scheme_is_case_insensitive(server: StoreServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url + "/v1/agl") as http:
        for scheme in ("bearer", "BEARER"):
            answer = await http.get("/statistics", headers={"authorization": f"{scheme} {KEY}"})
            assert answer.status_code == 200, scheme
        assert (await http.get("/statistics", headers={"authorization": f"Basic {KEY}"})).status_code == 401
