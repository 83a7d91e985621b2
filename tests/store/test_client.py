"""LightningStoreClient: retries, error mapping and lifecycle.

The store behaviour itself is covered by the contract suite, which runs over HTTP through
this client. Here a hand-written ASGI server injects faults (5xx, 4xx, refused connections)
so retries can be counted, and a TCP relay loses answers of a real server on their way back.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
import uvicorn
from starlette.types import ASGIApp

from agl_store import ConflictError, NotFoundError, StoreClosedError, StoreError, StoreUnavailableError
from agl_store.client import LightningStoreClient
from agl_store.errors import InvalidInputError
from agl_store.models import EnqueueRolloutRequest, Span
from agl_store.server import create_app
from agl_store.sqlite import SQLiteStore

from .http_server import start_store_server

STATISTICS = {
    "name": "fault",
    "total_rollouts": 0,
    "total_attempts": 0,
    "total_spans": 0,
    "total_resources": 0,
    "total_workers": 0,
}
Answer = tuple[int, bytes]


class FaultServer:
    """An ASGI app that plays back a script of (status, body) answers, then repeats the last."""

    def __init__(self, script: list[Answer], delay: float = 0.0) -> None:
        self.script = list(script)
        self.delay = delay
        self.requests: list[str] = []

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.requests.append(f"{scope['method']} {scope['path']}")
        if self.delay:
            await asyncio.sleep(self.delay)
        status, body = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        await send({"type": "http.response.body", "body": body})


def error(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message}, "detail": message})


@asynccontextmanager
async def serving(app: ASGIApp, sock: socket.socket | None = None) -> AsyncIterator[str]:
    """Serve `app` with uvicorn on 127.0.0.1 inside this event loop."""
    if sock is None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


def fast_client(url: str, retries: int = 3) -> LightningStoreClient:
    return LightningStoreClient(url, retries=retries, backoff_base=0.001, backoff_max=0.01, timeout=5.0)


async def test_a_5xx_is_retried_until_the_server_recovers() -> None:
    app = FaultServer([(503, error("store_closed", "restarting")), (500, b"oops"), (200, orjson.dumps(STATISTICS))])
    async with serving(app) as url, fast_client(url) as client:
        stats = await client.statistics()
    assert stats.name == "fault"
    assert app.requests == ["GET /v1/agl/statistics"] * 3


async def test_a_4xx_is_not_retried_and_keeps_its_error_class() -> None:
    app = FaultServer([(404, error("not_found", "rollout ro-x not found"))])
    async with serving(app) as url, fast_client(url) as client:
        with pytest.raises(NotFoundError, match="rollout ro-x not found"):
            await client.get_latest_attempt("ro-x")
    assert len(app.requests) == 1


async def test_error_codes_map_back_to_store_error_classes() -> None:
    app = FaultServer(
        [
            (409, error("conflict", "rollout is finished")),
            (418, b'{"error": {"code": "teapot", "message": "short and stout"}}'),
        ]
    )
    async with serving(app) as url, fast_client(url) as client:
        with pytest.raises(ConflictError, match="rollout is finished"):
            await client.update_rollout("ro-1", status="running")
        with pytest.raises(StoreError, match="short and stout") as unknown:
            await client.get_rollout_by_id("ro-1")
    assert type(unknown.value) is StoreError
    assert unknown.value.status_code == 418


async def test_5xx_after_the_last_retry_raises_the_servers_error() -> None:
    app = FaultServer([(500, error("store_error", "internal server error: RuntimeError: disk"))])
    async with serving(app) as url, fast_client(url, retries=2) as client:
        with pytest.raises(StoreError, match="disk"):
            await client.statistics()
    assert len(app.requests) == 3


async def test_connection_refused_is_retried_then_reported_as_unavailable() -> None:
    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        url = f"http://127.0.0.1:{reserved.getsockname()[1]}"
        async with fast_client(url, retries=2) as client:
            with pytest.raises(StoreUnavailableError, match="after 3 attempts"):
                await client.statistics()


async def test_a_server_that_does_not_answer_in_time_is_retried_then_unavailable() -> None:
    app = FaultServer([(200, orjson.dumps(STATISTICS))], delay=1.0)
    async with serving(app) as url:
        # The timeout covers connecting too: on a loaded machine an attempt can end before the server saw it.
        client = LightningStoreClient(url, retries=1, backoff_base=0.001, timeout=0.2)
        async with client:
            with pytest.raises(StoreUnavailableError, match="unreachable after 2 attempts"):
                await client.statistics()
    assert 1 <= len(app.requests) <= 2


class FirstFailedAttempt(logging.Handler):
    """Sets `seen` when the store client logs a failed attempt (it then backs off and retries)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "failed" in record.getMessage():
            self.seen.set()


async def test_a_server_that_comes_up_during_the_retries_is_reached() -> None:
    # The client's own transport (aiohttp), as in production: its refused connection must read as retryable.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    client_log = logging.getLogger("agl_store.client")
    failed, level = FirstFailedAttempt(), client_log.level
    client_log.addHandler(failed)
    client_log.setLevel(logging.INFO)
    try:
        async with LightningStoreClient(url, retries=1000, backoff_base=0.001, backoff_max=0.02) as client:
            call = asyncio.create_task(client.statistics())
            await failed.seen.wait()
            async with serving(FaultServer([(200, orjson.dumps(STATISTICS))]), sock):
                assert (await call).name == "fault"
    finally:
        client_log.removeHandler(failed)
        client_log.setLevel(level)


async def test_a_closed_client_refuses_work() -> None:
    client = LightningStoreClient("http://127.0.0.1:9")
    await client.open()
    await client.close()
    with pytest.raises(StoreClosedError):
        await client.statistics()


async def test_a_body_no_json_writer_can_hold_is_invalid_input_before_any_request() -> None:
    app = FaultServer([])
    deep: object = 1
    for _ in range(300):  # past pydantic-core's and orjson's ~254 levels
        deep = {"a": deep}
    async with serving(app) as url, fast_client(url) as client:
        with pytest.raises(InvalidInputError, match="request body is not JSON"):
            await client.enqueue_rollout(input=deep)
    assert app.requests == []


async def test_the_bearer_key_is_sent(tmp_path: Path) -> None:
    async with start_store_server(tmp_path / "store.db", key="k1") as store:
        assert (await store.statistics()).total_rollouts == 0
        async with LightningStoreClient(store.url, key="wrong") as intruder:
            with pytest.raises(StoreError, match="wrong bearer key") as denied:
                await intruder.statistics()
        assert denied.value.status_code == 401


async def test_add_many_spans_is_one_request_and_returns_sequence_ids(tmp_path: Path) -> None:
    async with start_store_server(tmp_path / "store.db") as store:
        attempted = await store.start_rollout(input={"task": 1})
        spans = [
            Span(rollout_id=attempted.rollout_id, attempt_id=attempted.attempt.attempt_id, name=f"s{i}")
            for i in range(50)
        ]
        stored = await store.add_many_spans(spans)
        assert [s.name for s in stored] == [f"s{i}" for i in range(50)]
        assert [s.sequence_id for s in stored] == sorted(s.sequence_id for s in stored)
        queried = await store.query_spans(attempted.rollout_id, limit=10)
        assert len(queried) == 10
        assert queried.total == 50


async def test_wait_for_rollouts_long_polls_until_they_finish(tmp_path: Path) -> None:
    async with start_store_server(tmp_path / "store.db") as store:
        (first, second) = await store.enqueue_many_rollouts(
            [EnqueueRolloutRequest(input={"i": 1}), EnqueueRolloutRequest(input={"i": 2})]
        )
        ids = [first.rollout_id, second.rollout_id]
        assert await store.wait_for_rollouts(rollout_ids=ids, timeout=0.05) == []
        waiting = asyncio.create_task(store.wait_for_rollouts(rollout_ids=ids, timeout=60))
        await store.update_rollout(first.rollout_id, status="cancelled")
        await store.update_rollout(second.rollout_id, status="cancelled")
        finished = await waiting
        assert sorted(r.rollout_id for r in finished) == sorted(ids)
        assert {r.status for r in finished} == {"cancelled"}


async def test_delete_and_expire_finished_rollouts(tmp_path: Path) -> None:
    async with start_store_server(tmp_path / "store.db") as store:
        finished = [await store.start_rollout(input=i) for i in range(3)]
        for rollout in finished:
            await store.update_rollout(rollout.rollout_id, status="succeeded")
        running = await store.start_rollout(input="still going")
        with pytest.raises(ConflictError):
            await store.delete_rollouts([finished[0].rollout_id, running.rollout_id])
        assert await store.delete_rollouts([finished[0].rollout_id]) == 1
        assert await store.expire_rollouts(older_than_seconds=0) == 2
        assert [r.rollout_id for r in await store.query_rollouts()] == [running.rollout_id]


async def test_a_pickled_client_reconnects_on_first_use(tmp_path: Path) -> None:
    import pickle

    async with start_store_server(tmp_path / "store.db") as store:
        rollout = await store.enqueue_rollout(input="shared")
        copy = pickle.loads(pickle.dumps(store))
        async with copy:
            assert await copy.get_rollout_by_id(rollout.rollout_id) == rollout


async def test_token_arrays_leave_packed_token_ids_as_int32_arrays(tmp_path: Path) -> None:
    from array import array

    prompt, short = list(range(1000, 1100)), [7, 8, 9]
    async with start_store_server(tmp_path / "store.db") as store:
        attempted = await store.start_rollout(input={"task": 1})
        call = {"agl.prompt_token_ids": prompt, "agl.choices": [{"index": 0, "token_ids": short}]}
        ids = {"rollout_id": attempted.rollout_id, "attempt_id": attempted.attempt.attempt_id}
        span = Span(**ids, name="agl.llm_call", attributes=call)
        await store.add_many_spans([span])
        async with LightningStoreClient(store.url, token_arrays=True) as reader:
            (read,) = await reader.query_spans(attempted.rollout_id)
        (plain,) = await store.query_spans(attempted.rollout_id)

    ids = read.attributes["agl.prompt_token_ids"]
    assert type(ids) is array and ids.typecode == "i" and ids.tolist() == prompt
    assert read.attributes["agl.choices"][0]["token_ids"] == short  # too short to be packed: a list
    assert plain.attributes == call  # without the option: plain lists, as stored


class AnswerLosingRelay:
    """A TCP relay to a server that, when `lose_next` is set, passes the next request on and
    then closes the caller's connection as soon as the answer begins: the server has done
    the work, the caller never hears of it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.lose_next = False
        self.lost = 0

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def requests() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        forwarding = asyncio.create_task(requests())
        try:
            while data := await up_reader.read(65536):
                if self.lose_next:
                    self.lose_next, self.lost = False, self.lost + 1
                    break
                writer.write(data)
                await writer.drain()
        finally:
            forwarding.cancel()
            await asyncio.gather(forwarding, return_exceptions=True)
            writer.close()
            up_writer.close()


async def test_creates_whose_answers_are_lost_are_retried_without_duplicates(tmp_path: Path) -> None:
    app = create_app(SQLiteStore(tmp_path / "store.db"), pages=False)
    async with serving(app) as url:
        relay = AnswerLosingRelay(int(url.rsplit(":", 1)[1]))
        relay_server = await asyncio.start_server(relay.relay, "127.0.0.1", 0)
        relay_url = f"http://127.0.0.1:{relay_server.sockets[0].getsockname()[1]}"
        try:
            async with fast_client(relay_url) as client:
                relay.lose_next = True
                started = await client.start_rollout(input={"q": 1})
                relay.lose_next = True
                queued = await client.enqueue_rollout(input={"q": 2})
                relay.lose_next = True
                batch = await client.enqueue_many_rollouts([EnqueueRolloutRequest(input=3), {"input": 4}])  # type: ignore[list-item]
        finally:
            relay_server.close()
            await relay_server.wait_closed()
        assert relay.lost == 3
        async with fast_client(url) as direct:
            stored = await direct.query_rollouts(sort_by="start_time")
    assert [r.rollout_id for r in stored] == [r.rollout_id for r in (started, queued, *batch)]
    assert [r.input for r in stored] == [{"q": 1}, {"q": 2}, 3, 4]
