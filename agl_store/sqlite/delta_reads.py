"""Reading spans stored as deltas: whole (`materialise`), as stored (`compact`), or only some
attribute keys (`keep_attributes`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from .. import call_span
from .delta_encoder import Call, Unpacked, call_of, decode_delta, repacked

ANCESTORS_SQL = (
    "WITH RECURSIVE chain(pk) AS (SELECT value FROM json_each(?) "
    "UNION SELECT s.base_pk FROM spans s JOIN chain c ON s.pk = c.pk WHERE s.base_pk IS NOT NULL) "
    "SELECT pk, base_pk, delta, attributes, tokens FROM spans WHERE pk IN chain ORDER BY pk"
)
"""The listed spans and all their ancestors, oldest first, in one query."""


Row = Sequence[Any]
"""`SPAN_COLUMNS` then pk, base_pk, delta (what `select_spans` reads)."""
PK, BASE_PK, DELTA = 13, 14, 15
ATTRIBUTES, TOKENS = 10, 11


def materialise(conn: sqlite3.Connection, rows: list[Row]) -> list[Row]:
    """`rows` with every delta rebuilt into whole attributes; the parents a page lacks are
    read in one query."""
    if all(row[BASE_PK] is None for row in rows):
        return rows
    stored: dict[int, tuple[Any, bytes | None, bytes | str, bytes | None]] = {
        row[PK]: (row[BASE_PK], row[DELTA], row[ATTRIBUTES], row[TOKENS]) for row in rows
    }
    missing = [row[BASE_PK] for row in rows if row[BASE_PK] is not None and row[BASE_PK] not in stored]
    if missing:
        for pk, base_pk, delta, text, blob in conn.execute(ANCESTORS_SQL, (orjson.dumps(missing),)):
            stored[pk] = (base_pk, delta, text, blob)
    referenced = {entry[0] for entry in stored.values() if entry[0] is not None}
    calls: dict[int, Call] = {}
    whole: dict[int, Unpacked] = {}
    for pk in sorted(stored):  # a parent was stored before its children
        base_pk, delta, text, blob = stored[pk]
        if base_pk is None:
            if pk in referenced:
                call = call_of(Unpacked.of(text, blob))
                calls[pk] = call if call is not None else Call(None, {}, None)
            continue
        unpacked, call = decode_delta(text, blob, orjson.loads(delta), calls[base_pk])  # type: ignore[arg-type]
        whole[pk] = unpacked
        calls[pk] = call
    out: list[Row] = []
    for row in rows:
        rebuilt = whole.get(row[PK])
        if rebuilt is None:
            out.append(row)
        else:
            out.append((*row[:ATTRIBUTES], rebuilt.text(), rebuilt.blob(), *row[TOKENS + 1 :]))
    return out


def compact(conn: sqlite3.Connection, rows: list[Row]) -> list[Row]:
    """`rows` as stored, each delta's attributes with `agl.delta` naming its parent
    (`call_span.CallDelta`)."""
    parents = [row[BASE_PK] for row in rows if row[BASE_PK] is not None]
    if not parents:
        return rows
    span_ids = dict(
        conn.execute(
            "SELECT pk, span_id FROM spans WHERE pk IN (SELECT value FROM json_each(?))", (orjson.dumps(parents),)
        )
    )
    out: list[Row] = []
    for row in rows:
        if row[BASE_PK] is None:
            out.append(row)
            continue
        info = orjson.loads(row[DELTA])
        reference = {
            "parent": span_ids[row[BASE_PK]],
            "choice": info["choice"],
            "prefix": info["prefix"],
            "messages": info["messages"],
        }
        text = row[ATTRIBUTES]
        text = text if isinstance(text, bytes) else text.encode()
        spliced = text[:-1] + b',"' + call_span.DELTA.encode() + b'":' + orjson.dumps(reference) + b"}"
        out.append((*row[:ATTRIBUTES], spliced, *row[ATTRIBUTES + 1 :]))
    return out


_TOP_LEVEL_SQL = (
    "SELECT key, type, CASE WHEN key IN (SELECT value FROM json_each(?2)) THEN value END FROM json_each(?1)"
)
_LITERALS = {"true": b"true", "false": b"false", "null": b"null"}


def _kept_json(conn: sqlite3.Connection, text: str, keys: bytes, wanted: frozenset[str]) -> bytes | None:
    """The attributes JSON with only the `wanted` keys, cut by one pass of SQLite's parser
    (the rest, the bodies, is parsed in C and never made a Python object); None when nothing
    goes, or when a kept value is a float (SQLite would round it: the caller uses orjson)."""
    parts: list[bytes] = []
    dropped = rounded = False
    for key, kind, value in conn.execute(_TOP_LEVEL_SQL, (text, keys)):
        if key not in wanted:
            dropped = True
        elif kind in ("object", "array"):
            parts.append(orjson.dumps(key) + b":" + value.encode())
        elif kind == "text":
            parts.append(orjson.dumps(key) + b":" + orjson.dumps(value))
        elif kind == "integer":
            parts.append(orjson.dumps(key) + b":" + str(value).encode())
        elif kind in _LITERALS:
            parts.append(orjson.dumps(key) + b":" + _LITERALS[kind])
        else:
            rounded = True
    if not dropped:
        return None
    if rounded:
        return orjson.dumps({key: value for key, value in orjson.loads(text).items() if key in wanted})
    return b"{" + b",".join(parts) + b"}"


def keep_attributes(conn: sqlite3.Connection, rows: list[Row], keys: frozenset[str]) -> list[Row]:
    """`rows` with only the attribute keys in `keys` (and `agl.delta`); the token blob keeps
    only the arrays of those keys, so what is left out is neither sent nor decoded."""
    keys = keys | {call_span.DELTA}
    listed = orjson.dumps(sorted(keys))
    out: list[Row] = []
    for row in rows:
        text = row[ATTRIBUTES]
        text = text.decode() if isinstance(text, bytes) else text  # SQLite 3.45+ reads a blob as JSONB
        kept = _kept_json(conn, text, listed, keys)
        if kept is None:
            out.append(row)
            continue
        blob = row[TOKENS]
        if blob is not None:
            stored = Unpacked.of(b"", blob, {})
            blob = repacked({}, [entry for entry in stored.index if entry[0][0] in keys], stored.data).blob()
        out.append((*row[:ATTRIBUTES], kept, blob, *row[TOKENS + 1 :]))
    return out
