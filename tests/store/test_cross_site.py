"""A keyless store server on 127.0.0.1 against web pages: a page the user visits must not be
able to write to it (form-like bodies, foreign Origin, a rebound Host), while its own web view
and ordinary clients keep working. One `agl store serve` subprocess serves the module."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from agl_store.client import LightningStoreClient
from agl_store.models import Span

from .http_server import StoreServerProcess


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StoreServerProcess]:
    process = StoreServerProcess(tmp_path_factory.mktemp("cross-site") / "store.db")
    await process.start()
    yield process
    await process.stop()


@pytest.fixture
async def http(server: StoreServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url) as client:
        yield client


async def _finished_rollout(server: StoreServerProcess) -> str:
    async with LightningStoreClient(server.url) as store:
        rollout = await store.start_rollout(input={"q": 1})
        await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")
        return rollout.rollout_id


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
async def test_form_like_writes_are_refused(server, http, content_type: str) -> None:
    rollout_id = await _finished_rollout(server)
    answer = await http.post(
        "/v1/agl/rollouts/expire", content=b'{"older_than_seconds": 0}', headers={"content-type": content_type}
    )
    assert answer.status_code == 415 and answer.json()["error"]["code"] == "unsupported_media_type"
    async with LightningStoreClient(server.url) as store:
        assert await store.get_rollout_by_id(rollout_id) is not None


async def test_an_empty_write_passes_whatever_type_it_claims(http) -> None:
    # aiohttp (agent-lightning 0.3's client) sends `json=None` as an empty octet-stream body.
    answer = await http.post("/v1/agl/workers/w1", headers={"content-type": "application/octet-stream"})
    assert answer.status_code == 200 and answer.json()["worker_id"] == "w1"


@pytest.mark.parametrize(
    "headers",
    [{"origin": "https://evil.example"}, {"origin": "null"}, {"host": "evil.example"}, {"host": "attacker.test:4747"}],
)
async def test_foreign_origins_and_hosts_are_refused(server, http, headers: dict) -> None:
    rollout_id = await _finished_rollout(server)
    answer = await http.post("/v1/agl/rollouts/expire", json={"older_than_seconds": 0}, headers=headers)
    assert answer.status_code == 403 and answer.json()["error"]["code"] in ("cross_origin", "forbidden_host")
    assert (await http.get("/v1/agl/statistics", headers=headers)).status_code == 403  # reads too
    async with LightningStoreClient(server.url) as store:
        assert await store.get_rollout_by_id(rollout_id) is not None


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]"])
async def test_loopback_names_and_the_servers_own_pages_pass(server, http, host: str) -> None:
    port = server.url.rsplit(":", 1)[1]
    headers = {"host": f"{host}:{port}", "origin": f"http://{host}:{port}"}
    answer = await http.post("/v1/agl/rollouts/expire", json={"older_than_seconds": 10**9}, headers=headers)
    assert answer.status_code == 200, answer.text


async def test_every_answer_says_nosniff(http) -> None:
    for answer in (
        await http.get("/v1/agl/statistics"),
        await http.get("/v1/agl/rollouts/no-such-id"),
        await http.get("/health"),
    ):
        assert answer.headers["x-content-type-options"] == "nosniff"


async def test_otlp_keeps_its_own_types(http) -> None:
    answer = await http.post("/v1/traces", content=b"", headers={"content-type": "application/x-protobuf"})
    assert answer.status_code == 200
    refused = await http.post("/v1/traces", content=b"x", headers={"content-type": "text/plain"})
    assert refused.status_code == 400 and "unsupported Content-Type" in refused.json()["error"]["message"]


async def test_the_store_client_still_writes_everything(server) -> None:
    async with LightningStoreClient(server.url) as store:
        rollout = await store.start_rollout(input={"q": 1})
        ids = (rollout.rollout_id, rollout.attempt.attempt_id)
        tokens = {"agl.prompt_token_ids": list(range(20))}
        stored = await store.add_many_spans([Span(rollout_id=ids[0], attempt_id=ids[1], name="s", attributes=tokens)])
        assert stored[0].sequence_id is not None
        assert (await store.query_spans(ids[0]))[0].attributes["agl.prompt_token_ids"] == list(range(20))
        await store.update_attempt(ids[0], "latest", status="succeeded")
        assert await store.delete_rollouts([ids[0]]) == 1
