"""Stored span rows straight to JSON, and the packed-token wire form the store client asks for.

A 100-span rollout of LLM calls holds about 90,000 token ids. Turning each stored row into
a `Span` model and serialising it builds every id as a Python int twice (server and
client) and runs pydantic over all of them; that was most of a `query_spans` call. Here
the server splices a row's JSON from its stored columns instead, without a model:

- plain (the default, what agent-lightning 0.3 clients get): token arrays are decoded
  once and written by orjson;
- packed (when the request carries `x-agl-span-encoding: packed-v1`): the attributes'
  stored JSON text, which has `null` where the arrays go, is copied as is, and each
  span's stored int32 blob travels base64-encoded in the page's `packed_tokens` list; the
  client validates the light spans and then fills the arrays in with `fill_packed`.

The server answers a packed page with the same header, so a client talking to a server
without this support still gets, and reads, plain JSON.

Writes go the same way: the client packs each span's token arrays itself
(`packed_batch`) and posts to `/spans/batch/packed`, which stores the blobs after checking
them; the server never parses the ids. A server without that route answers 404 and the
client falls back to the plain `/spans/batch`.
"""

from __future__ import annotations

import base64
from typing import Any, Dict, List, Optional, Sequence

import orjson
from pydantic import TypeAdapter

from .models import Span
from pydantic_core import to_json

from .tokens import fill_packed, pack_attributes, unpack_attributes

ENCODING_HEADER = "x-agl-span-encoding"
PACKED = "packed-v1"

_SPANS = TypeAdapter(List[Span])


def _as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _splice(row: Sequence[Any], attributes: bytes) -> bytes:
    """One span's JSON: the indexed columns, the attributes, then the `rest` JSON object."""
    head = orjson.dumps(
        {
            "rollout_id": row[0],
            "attempt_id": row[1],
            "sequence_id": row[2],
            "trace_id": row[3],
            "span_id": row[4],
            "parent_id": row[5],
            "name": row[6],
            "start_time": row[7],
            "end_time": row[8],
        }
    )
    rest = _as_bytes(row[12]).strip()
    tail = b"}" if rest == b"{}" else b"," + rest[1:]
    return head[:-1] + b',"attributes":' + attributes + tail


def plain_span_json(row: Sequence[Any]) -> bytes:
    """A `SPAN_COLUMNS` row as the JSON of its span, token ids as JSON arrays."""
    text, blob = _as_bytes(row[10]), row[11]
    attributes = text if blob is None else orjson.dumps(unpack_attributes(text, blob))
    return _splice(row, attributes)


def packed_span_json(row: Sequence[Any]) -> bytes:
    """A row as span JSON whose packed token arrays are `null` (see `packed_tokens`)."""
    return _splice(row, _as_bytes(row[10]))


def packed_tokens(row: Sequence[Any]) -> Optional[str]:
    """The row's stored token blob, base64, or None when it has none."""
    blob = row[11]
    return None if blob is None else base64.b64encode(blob).decode("ascii")


def page_json(rows: Sequence[Any], *, packed: bool, limit: int, offset: int, total: int) -> bytes:
    """The PaginatedResult of span rows: items, limit, offset, total (+ packed_tokens)."""
    encode = packed_span_json if packed else plain_span_json
    rest: Dict[str, Any] = {"limit": limit, "offset": offset, "total": total}
    if packed:
        rest["packed_tokens"] = [packed_tokens(row) for row in rows]
    return b'{"items":[' + b",".join(encode(row) for row in rows) + b"]," + orjson.dumps(rest)[1:]


def spans_from_page(data: Dict[str, Any], packed: bool) -> List[Span]:
    """The spans of a decoded page; packed pages get their token arrays filled in."""
    spans = _SPANS.validate_python(data["items"])
    if packed:
        for span, blob in zip(spans, data["packed_tokens"], strict=True):
            if blob is not None:
                fill_packed(span.attributes, base64.b64decode(blob))
    return spans


def packed_batch(spans: Sequence[Span]) -> bytes:
    """The body of `/spans/batch/packed`: `{"spans": [...], "packed_tokens": [...]}`, each
    span's token arrays `null` in its attributes and base64 in its `packed_tokens` entry."""
    items: List[bytes] = []
    blobs: List[Optional[str]] = []
    for span in spans:
        skeleton, blob = pack_attributes(span.attributes)
        head = to_json(span, exclude={"attributes"})
        items.append(head[:-1] + (b',"attributes":' if len(head) > 2 else b'"attributes":') + skeleton + b"}")
        blobs.append(None if blob is None else base64.b64encode(blob).decode("ascii"))
    return b'{"spans":[' + b",".join(items) + b'],"packed_tokens":' + orjson.dumps(blobs) + b"}"


def blobs_of(packed_tokens: Sequence[Optional[str]]) -> List[Optional[bytes]]:
    """`packed_tokens` entries decoded; ValueError for one that is not base64 or null."""
    blobs: List[Optional[bytes]] = []
    for index, entry in enumerate(packed_tokens):
        if entry is None:
            blobs.append(None)
            continue
        try:
            blobs.append(base64.b64decode(entry, validate=True))
        except (TypeError, ValueError):
            raise ValueError(f"packed_tokens[{index}] is not base64 or null") from None
    return blobs
