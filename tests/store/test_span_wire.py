"""Spans read over HTTP: plain JSON for any client, packed token ids for agl's own.

The server writes stored rows straight to JSON (`agl_store.span_wire`); these tests pin
that both wire forms give back exactly the spans that were stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.routing import Mount

from agl_store.client import LightningStoreClient
from agl_store.models import Span
from agl_store.queries import SpanQuery
from agl_store.server import create_app
from agl_store.span_wire import (
    ENCODING_HEADER,
    PACKED,
    PACKED_MEDIA_TYPE,
    frame,
    packed_batch,
    page_json,
    read_frame,
    spans_from_page,
)
from agl_store.sqlite import SQLiteStore
from tests.proxy.helpers import serve

from .http_server import start_store_server


def llm_call_attributes(seed: int) -> dict[str, Any]:
    prompt = [seed * 1000 + i for i in range(40)]
    output = [7, 8, 9, 10, 11, 12, 13, 14, 15, 2_000_000_000]
    return {
        "agl.request": {"messages": [{"role": "user", "content": "line one\nline two"}], "max_tokens": 16},
        "agl.response": {"prompt_token_ids": prompt, "choices": [{"token_ids": output, "text": "hi"}]},
        "agl.prompt_token_ids": prompt,  # the same list named twice, as the proxy does
        "short": [1, 2, 3],
        "too_big": [1, 2, 3, 4, 5, 6, 7, 8, 2**40],
        "flags": [True, False, True, False, True, False, True, False],
    }


def spans_of(rollout_id: str, attempt_id: str) -> list[Span]:
    spans = [
        Span(rollout_id=rollout_id, attempt_id=attempt_id, name="agl.llm_call", attributes=llm_call_attributes(seed))
        for seed in range(3)
    ]
    spans.append(Span(rollout_id=rollout_id, attempt_id=attempt_id, name="agl.reward", attributes={"v": 1.0}))
    spans.append(Span(rollout_id=rollout_id, attempt_id=attempt_id, name="empty", extra_field={"kept": True}))
    return spans


async def test_rows_written_as_json_equal_the_stored_spans(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "store.db") as store:
        rollout = await store.start_rollout(input={"q": 1})
        await store.add_many_spans(spans_of(rollout.rollout_id, rollout.attempt.attempt_id))
        stored = await store.query_spans(rollout.rollout_id)
        rows = await store.find_span_rows(SpanQuery(rollout_id=rollout.rollout_id), tuple)

        plain_body = page_json(rows, packed=False, limit=-1, offset=0, total=rows.total)
        plain = orjson.loads(plain_body)
        assert plain["items"] == [span.model_dump(mode="json") for span in stored]
        assert (plain["limit"], plain["offset"], plain["total"]) == (-1, 0, 5)

        packed_body = page_json(rows, packed=True, limit=-1, offset=0, total=rows.total)
        packed, blobs = read_frame(packed_body)
        assert packed["items"][0]["attributes"]["agl.prompt_token_ids"] is None  # it travels in the blob
        assert [blob is not None for blob in blobs] == [True, True, True, False, False]
        assert spans_from_page(packed_body, packed=True) == (list(stored), 5)
        assert spans_from_page(plain_body, packed=False) == (list(stored), 5)


async def test_the_client_reads_packed_spans_and_plain_clients_get_json(tmp_path: Path) -> None:
    async with start_store_server(tmp_path / "store.db") as client:
        rollout = await client.start_rollout(input={"q": 1})
        sent = spans_of(rollout.rollout_id, rollout.attempt.attempt_id)
        await client.add_many_spans(sent)

        read = await client.query_spans(rollout.rollout_id, "latest")
        assert [span.model_dump(exclude={"sequence_id"}) for span in read] == [
            span.model_dump(exclude={"sequence_id"}) for span in sent
        ]
        assert [span.sequence_id for span in read] == [1, 2, 3, 4, 5]
        assert read.total == 5

        # An agent-lightning 0.3 client sends no header and gets plain JSON arrays.
        async with httpx.AsyncClient(base_url=client.url) as http:
            body = {"rollout_id": rollout.rollout_id, "limit": 2, "offset": 1}
            plain = await http.post("/v1/agl/spans/search", json=body)
            packed = await http.post("/v1/agl/spans/search", json=body, headers={ENCODING_HEADER: PACKED})
            query = await http.get("/v1/agl/spans", params={"rollout_id": rollout.rollout_id})
        assert ENCODING_HEADER not in plain.headers
        assert plain.json()["items"][0]["attributes"] == sent[1].attributes
        assert plain.json()["total"] == 5
        assert packed.headers[ENCODING_HEADER] == PACKED
        assert len(read_frame(packed.content)[1]) == 2
        assert [item["name"] for item in query.json()["items"]] == [span.name for span in sent]


async def test_spans_written_packed_read_back_whole_in_process(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    async with start_store_server(db) as client:
        rollout = await client.start_rollout(input={"q": 1})
        sent = spans_of(rollout.rollout_id, rollout.attempt.attempt_id)
        stored = await client.add_many_spans(sent)  # one packed request
        assert [span.attributes for span in stored] == [span.attributes for span in sent]
        assert await client.add_span(sent[0]) is None  # a duplicate is ignored, packed or not
    async with SQLiteStore(db) as store:
        read = await store.query_spans(rollout.rollout_id)
    assert [span.attributes for span in read] == [span.attributes for span in sent]


async def test_a_packed_blob_that_does_not_fit_its_span_is_refused(tmp_path: Path) -> None:
    async with start_store_server(tmp_path / "store.db") as client:
        rollout = await client.start_rollout(input={"q": 1})
        span = spans_of(rollout.rollout_id, rollout.attempt.attempt_id)[0]
        head, (good_blob,) = read_frame(packed_batch([span]))
        assert good_blob is not None
        index, data = good_blob.split(b"\n", 1)
        wrong = {
            "past the data": index + b"\n" + data[:-4],
            "no null there": b'[[["agl.request"],0,1]]\n' + data,
            "no such path": b'[[["missing"],0,1]]\n' + data,
            "not an index": b"{}\n" + data,
        }
        url = "/v1/agl/spans/batch/packed"
        async with httpx.AsyncClient(base_url=client.url, headers={"content-type": PACKED_MEDIA_TYPE}) as http:
            for problem, blob in wrong.items():
                answer = await http.post(url, content=frame({"spans": head["spans"]}, [blob]))
                assert answer.status_code == 400, problem
                assert "packed_tokens[0]" in answer.json()["error"]["message"], problem
            no_frame = orjson.dumps({"spans": head["spans"], "packed_tokens": [[0, 10]]})
            assert (await http.post(url, content=no_frame)).status_code == 400
            past_the_end = orjson.dumps({"spans": head["spans"], "packed_tokens": [[0, 10]]}) + b"\n" + b"1234"
            assert (await http.post(url, content=past_the_end)).status_code == 400
        assert await client.query_spans(rollout.rollout_id) == []


async def test_the_client_falls_back_to_plain_writes_on_a_server_without_packed_ones(tmp_path: Path) -> None:
    async with start_store_server(tmp_path / "store.db") as real:
        forwarded: list[str] = []

        async def old_server(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
            """The real server minus /spans/batch/packed, as a server before it answers."""
            forwarded.append(scope["path"])
            if scope["path"].endswith("/batch/packed"):
                body = b'{"error": {"code": "no_such_route", "message": "Not Found"}}'
                await send({"type": "http.response.start", "status": 404, "headers": []})
                await send({"type": "http.response.body", "body": body})
                return
            async with httpx.AsyncClient(base_url=real.url) as http:
                request = await receive()
                headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k == b"content-type"]
                answer = await http.request(
                    scope["method"], scope["path"], content=request.get("body", b""), headers=headers
                )
            await send({"type": "http.response.start", "status": answer.status_code, "headers": []})
            await send({"type": "http.response.body", "body": answer.content})

        rollout = await real.start_rollout(input={"q": 1})
        sent = spans_of(rollout.rollout_id, rollout.attempt.attempt_id)
        async with (
            serve(Starlette(routes=[Mount("/", old_server)])) as old_url,
            LightningStoreClient(old_url) as client,
        ):
            await client.add_many_spans(sent[:2])
            await client.add_many_spans(sent[2:])
        assert [path.rsplit("/", 2)[-2:] for path in forwarded] == [
            ["batch", "packed"],
            ["spans", "batch"],
            ["spans", "batch"],
        ]
        assert [span.attributes for span in await real.query_spans(rollout.rollout_id)] == [s.attributes for s in sent]


async def test_a_store_with_only_the_contract_serves_packed_writes_and_row_reads(tmp_path: Path) -> None:
    """The server relies on `add_packed_spans` and `find_span_rows`; a store without its own
    (here a client of another server, relayed) serves them through the contract's defaults."""
    async with start_store_server(tmp_path / "store.db") as real:
        rollout = await real.start_rollout(input={"q": 1})
        sent = spans_of(rollout.rollout_id, rollout.attempt.attempt_id)
        relay = create_app(LightningStoreClient(real.url), pages=False)  # opened and closed by the app
        async with serve(relay) as relay_url, LightningStoreClient(relay_url) as client:
            stored = await client.add_many_spans(sent)  # packed by the client, unpacked by the default
            read = await client.query_spans(rollout.rollout_id, limit=4)
        assert [span.sequence_id for span in stored] == [1, 2, 3, 4, 5]
        assert [span.attributes for span in read] == [span.attributes for span in sent[:4]]
        assert read.total == 5
        assert [span.attributes for span in await real.query_spans(rollout.rollout_id)] == [s.attributes for s in sent]
