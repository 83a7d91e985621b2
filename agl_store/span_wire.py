"""Stored span rows straight to JSON, and the packed-token wire form the store client uses.

A 100-span rollout of LLM calls holds about 90,000 token ids. Turning each stored row into
a `Span` model and serialising it builds every id as a Python int twice (server and
client) and runs pydantic over all of them; that was most of a `query_spans` call. Here
the server splices a row's JSON from its stored columns instead, without a model:

- plain (the default, what agent-lightning 0.3 clients get): token arrays are decoded
  once and written by orjson;
- packed (when the request carries `x-agl-span-encoding: packed-v1`): the attributes'
  stored JSON text, which has `null` where the arrays go, is copied as is, and the
  stored int32 blobs follow the JSON (see "frames" below); the client validates the
  light spans and then fills the arrays in with `packed_attributes.fill_packed`.

The server answers a packed page with the same header, so a client talking to a server
without this support still gets, and reads, plain JSON.

Writes go the same way: the client packs each span's token arrays itself
(`packed_batch`) and posts the frame to `/spans/batch/packed`, which stores the blobs
after checking them against their spans; the server never parses the ids. A server
without that route answers 404 and the client falls back to the plain `/spans/batch`.

Frames: one line of JSON (orjson never writes a raw newline), a newline, then the blobs
back to back. The JSON's `packed_tokens` list has, per span, `[start, length]` of its
blob in that binary part, or null.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from typing import Any

import orjson
from pydantic import TypeAdapter
from pydantic_core import to_json

from .errors import InvalidInputError
from .models import Span
from .packed_attributes import fill_packed, pack_attributes, unpack_attributes

ENCODING_HEADER = "x-agl-span-encoding"
PACKED = "packed-v1"
PACKED_MEDIA_TYPE = "application/vnd.agl.packed-spans"
"""The Content-Type of a `packed_batch` frame posted to `/spans/batch/packed`."""

SPAN_LIST: TypeAdapter[list[Span]] = TypeAdapter(list[Span])
"""Validates a JSON list of spans (pages read here, batches the server takes)."""


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


def frame(head: dict[str, Any], blobs: Sequence[bytes | None], prefix: bytes = b"{") -> bytes:
    """`head` as one JSON line with `packed_tokens` ranges added, then the blobs.

    `prefix` is JSON text that goes before `head`'s own keys (say, `{"items":[...],`),
    so that big, already encoded parts are not parsed and re-encoded.
    """
    ranges: list[tuple[int, int] | None] = []
    start = 0
    for blob in blobs:
        if blob is None:
            ranges.append(None)
        else:
            ranges.append((start, len(blob)))
            start += len(blob)
    line = prefix + orjson.dumps({**head, "packed_tokens": ranges})[1:]
    return line + b"\n" + b"".join(blob for blob in blobs if blob is not None)


def read_frame(body: bytes) -> tuple[Any, list[bytes | None]]:
    """The JSON and the blobs of a frame; ValueError when it is not one."""
    split = body.find(b"\n")
    if split < 0:
        raise ValueError("a packed body is one line of JSON, a newline, then the token blobs")
    try:
        head = orjson.loads(memoryview(body)[:split])
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"malformed JSON line: {exc}") from None
    ranges = head.get("packed_tokens") if type(head) is dict else None
    if type(ranges) is not list:
        raise ValueError("packed_tokens: expected a list of [start, length] or null")
    data = memoryview(body)[split + 1 :]
    blobs: list[bytes | None] = []
    for index, entry in enumerate(ranges):
        if entry is None:
            blobs.append(None)
            continue
        if (
            type(entry) is not list
            or len(entry) != 2
            or any(type(n) is not int or n < 0 for n in entry)
            or entry[0] + entry[1] > len(data)
        ):
            raise ValueError(f"packed_tokens[{index}] is not a [start, length] inside the blobs")
        blobs.append(bytes(data[entry[0] : entry[0] + entry[1]]))
    return head, blobs


def page_json(rows: Sequence[Any], *, packed: bool, limit: int, offset: int, total: int) -> bytes:
    """The PaginatedResult of span rows: items, limit, offset, total; a frame when packed."""
    encode = packed_span_json if packed else plain_span_json
    items = b'{"items":[' + b",".join(encode(row) for row in rows) + b"],"
    rest: dict[str, Any] = {"limit": limit, "offset": offset, "total": total}
    if packed:
        return frame(rest, [row[11] for row in rows], prefix=items)
    return items + orjson.dumps(rest)[1:]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No garbage collection inside the block; the collector is switched back on after it,
    exceptions included, unless it was already off (so blocks nest).

    Decoding a page makes some 10^5 containers that all survive. Each 700 of them would
    start a collection, and in a process with a big heap (a trainer, a runner) the full
    ones that follow cost more than the decoding itself: measured 6 -> 21 ms per 100-span
    page with a million live objects around. After the block, one collection sees them.
    The collector is the process's: a block that awaits (the trainer's batch read,
    `agl_train.verl_glue.step.read_succeeded`) pauses it for the other tasks and threads meanwhile too;
    objects freed by reference counting still go at once, only cycles wait for the end.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def spans_from_page(body: bytes, packed: bool, *, arrays: bool = False) -> tuple[list[Span], int]:
    """The spans of a page body and its `total`; packed pages get their token arrays back
    (as `array('i')` with `arrays`, see `packed_attributes.fill_packed`)."""
    with collector_paused():
        if not packed:
            data = orjson.loads(body)
            return SPAN_LIST.validate_python(data["items"]), data["total"]
        data, blobs = read_frame(body)
        spans = SPAN_LIST.validate_python(data["items"])
        for span, blob in zip(spans, blobs, strict=True):
            if blob is not None:
                fill_packed(span.attributes, blob, arrays=arrays)
        return spans, data["total"]


def packed_batch(spans: Sequence[Span]) -> bytes:
    """The frame `/spans/batch/packed` takes: `{"spans": [...], "packed_tokens": [...]}`
    with each span's token arrays `null` in its attributes and its blob after the JSON."""
    items: list[bytes] = []
    blobs: list[bytes | None] = []
    for index, span in enumerate(spans):
        try:
            skeleton, blob = pack_attributes(span.attributes)
        except InvalidInputError as exc:  # name the span, as the server would
            raise InvalidInputError(f"spans[{index}].{exc.message}") from None
        head = to_json(span, exclude={"attributes"})
        items.append(head[:-1] + (b',"attributes":' if len(head) > 2 else b'"attributes":') + skeleton + b"}")
        blobs.append(blob)
    return frame({}, blobs, prefix=b'{"spans":[' + b",".join(items) + b"],")
