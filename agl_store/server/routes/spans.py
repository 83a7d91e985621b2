"""Spans: add one, add a batch in one transaction, query, and issue sequence numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...errors import InvalidInputError
from ...models import LATEST_ATTEMPT, Span
from ...queries import SpanQuery
from ...span_wire import ENCODING_HEADER, PACKED, SPAN_LIST, page_json, read_frame
from ...web.wire import JSON_MEDIA_TYPE, endpoint, store_of, validate_json, validate_model, validate_query
from ..metrics import metrics_of
from ..schemas import ManySequenceIdsBody, NextSequenceIdBody, check_page


async def add_span(request: Request) -> Any:
    span = validate_model(Span, await request.body())
    stored = await store_of(request).add_span(span)
    if stored is not None:
        metrics_of(request).spans_ingested(1)
    return stored


async def add_many_spans(request: Request) -> Any:
    """Store a JSON array of spans in one transaction.

    The reply, `{"stored": [{"index", "sequence_id"}, ...]}`, names each stored span by its
    position in the request (duplicates are left out): the caller has the spans already, and
    echoing LLM-call spans back would double the bytes on the wire. A span sent with attempt
    id "latest" also gets the `attempt_id` it was stored under.
    """
    spans = validate_json(SPAN_LIST, await request.body())
    stored = await store_of(request).add_many_spans(spans) if spans else []
    metrics_of(request).spans_ingested(len(stored))
    return {"stored": stored_positions(spans, stored)}


async def add_packed_spans(request: Request) -> Any:
    """Like `add_many_spans` for a `span_wire.packed_batch` frame: token ids arrive packed."""
    try:
        head, blobs = read_frame(await request.body())
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    spans = SPAN_LIST.validate_python(head.get("spans"))
    stored = await store_of(request).add_packed_spans(spans, blobs)
    metrics_of(request).spans_ingested(len(stored))
    return {"stored": stored_positions(spans, stored)}


def stored_positions(sent: Sequence[Span], stored: Sequence[Span]) -> list[dict[str, Any]]:
    """Where each stored span was in the request: the store keeps the request's order and
    leaves duplicates out, so each stored span is the next sent one with its identity."""
    positions: list[dict[str, Any]] = []
    index = 0
    for span in stored:
        while not _same_span(sent[index], span):
            index += 1
        position: dict[str, Any] = {"index": index, "sequence_id": span.sequence_id}
        if sent[index].attempt_id != span.attempt_id:  # sent as "latest"
            position["attempt_id"] = span.attempt_id
        positions.append(position)
        index += 1
    return positions


def _same_span(sent: Span, stored: Span) -> bool:
    return (
        sent.span_id == stored.span_id
        and sent.rollout_id == stored.rollout_id
        and sent.attempt_id in (stored.attempt_id, LATEST_ATTEMPT)
    )


async def _query(request: Request, query: SpanQuery) -> Any:
    check_page(query, Span)
    # Rows go straight to JSON: no Span models, token ids left packed when the client asks.
    packed = request.headers.get(ENCODING_HEADER) == PACKED
    rows = await store_of(request).find_span_rows(query, tuple)
    body = page_json(rows, packed=packed, limit=query.limit, offset=query.offset, total=rows.total)
    headers = {ENCODING_HEADER: PACKED} if packed else None
    return Response(body, media_type=JSON_MEDIA_TYPE, headers=headers)


async def query_spans(request: Request) -> Any:
    return await _query(request, validate_query(SpanQuery, request, list_fields=SpanQuery.list_fields))


async def search_spans(request: Request) -> Any:
    return await _query(request, validate_model(SpanQuery, await request.body()))


async def next_sequence_id(request: Request) -> Any:
    body = validate_model(NextSequenceIdBody, await request.body())
    return {"sequence_id": await store_of(request).get_next_span_sequence_id(body.rollout_id, body.attempt_id)}


async def many_sequence_ids(request: Request) -> Any:
    body = validate_model(ManySequenceIdsBody, await request.body())
    ids = (
        await store_of(request).get_many_span_sequence_ids(body.rollout_attempt_ids) if body.rollout_attempt_ids else []
    )
    return {"sequence_ids": list(ids)}


def routes(prefix: str) -> list[Route]:
    base = prefix + "/spans"
    return [
        endpoint(base, add_span, methods=["POST"], status_code=201),
        endpoint(base, query_spans, methods=["GET"]),
        endpoint(base + "/batch", add_many_spans, methods=["POST"], status_code=201),
        endpoint(base + "/batch/packed", add_packed_spans, methods=["POST"], status_code=201),
        endpoint(base + "/search", search_spans, methods=["POST"]),
        endpoint(base + "/next", next_sequence_id, methods=["POST"]),
        endpoint(base + "/next/many", many_sequence_ids, methods=["POST"]),
    ]
