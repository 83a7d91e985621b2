"""Spans read over HTTP: plain JSON for any client, packed token ids for agl's own.

The server writes stored rows straight to JSON (`agl_store.span_wire`); these tests pin
that both wire forms give back exactly the spans that were stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import httpx
import orjson

from agl_store.models import Span
from agl_store.span_wire import ENCODING_HEADER, PACKED, page_json, spans_from_page
from agl_store.sqlite import SQLiteStore

from .http_server import start_store_server


def llm_call_attributes(seed: int) -> Dict[str, Any]:
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


def spans_of(rollout_id: str, attempt_id: str) -> List[Span]:
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
        rows = await store.query_span_rows(rollout.rollout_id, decode=tuple)

        plain = orjson.loads(page_json(rows, packed=False, limit=-1, offset=0, total=rows.total))
        assert plain["items"] == [span.model_dump(mode="json") for span in stored]
        assert (plain["limit"], plain["offset"], plain["total"]) == (-1, 0, 5)

        packed = orjson.loads(page_json(rows, packed=True, limit=-1, offset=0, total=rows.total))
        assert packed["items"][0]["attributes"]["agl.prompt_token_ids"] is None  # it travels in packed_tokens
        assert spans_from_page(packed, packed=True) == list(stored)
        assert spans_from_page(plain, packed=False) == list(stored)


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
        assert read.total == 5  # type: ignore[attr-defined]

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
        assert len(packed.json()["packed_tokens"]) == 2
        assert [item["name"] for item in query.json()["items"]] == [span.name for span in sent]
