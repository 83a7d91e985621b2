"""LLM calls stored as deltas of earlier calls of their attempt.

A multi-turn agent sends its whole conversation again on every call, so storing each call
whole grows with the square of its turns. A call whose prompt token ids start with an earlier
call's context (its prompt, then one choice's generated ids) is stored as a reference to that
call (`base_pk`) and the rest:

- `agl.prompt_token_ids` holds only the ids after the first `prefix` ids of the parent's
  context (parent prompt + choice `choice`'s `token_ids`, or the parent prompt alone when
  `choice` is None);
- `agl.request.messages` holds only the messages after the parent's first `messages`;
- every other place that held the whole prompt's ids (the response body's
  `prompt_token_ids`, a completion choice's) is `null`, listed in `prompt_paths`.

The parent is always a call already stored in the same attempt: one whose context shares
the longest prefix with the new prompt, found in a bounded in-memory index of each attempt's
recent calls (`DeltaIndex`: their ids and messages, compared as memory) and checked against
the stored row's unique `stamp` before a delta that names it goes in (by the insert itself
for one span, in one query for a batch), so an index that missed a rollback, a deletion or
another process's writes picks a worse parent at worst, never a wrong one. Every other
attribute is stored as it came.

Readers see whole spans: `materialise` rebuilds each row from its chain of parents, read
in one recursive query (`ANCESTORS_SQL`) when the page does not hold them already, so a read
costs the same few queries at any turn.
"""

from __future__ import annotations

import itertools
import operator
import os
import sqlite3
import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from .. import call_span
from ..packed_attributes import MIN_PACKED_LENGTH, NOT_FOUND, value_at

RECENT_CALLS = 8
"""Calls per attempt the index remembers (each choice's context counts as one)."""
MAX_ATTEMPTS = 4096
"""Attempts the index remembers, least recently written first out."""
MAX_DEPTH = 1024
"""A call at this depth of deltas is stored whole again, bounding a chain's length."""

MESSAGES_PATH = (call_span.REQUEST, "messages")
_STAMP_PREFIX = os.urandom(8)
_STAMPS = itertools.count()
_PROMPT_PATH = [call_span.PROMPT_TOKEN_IDS]
_LITTLE_ENDIAN = sys.byteorder == "little"

Path = list[Any]


def int32_bytes(values: Any) -> bytes | None:
    """A short id list kept as JSON (under `MIN_PACKED_LENGTH`) as int32 bytes; None if not ids."""
    if type(values) is not list or not all(type(v) is int for v in values):
        return None
    try:
        ints = array("i", values)
    except OverflowError:
        return None
    if not _LITTLE_ENDIAN:
        ints.byteswap()
    return ints.tobytes()


@dataclass
class Unpacked:
    """A stored attributes skeleton and its token blob, split for delta work."""

    skeleton: dict[str, Any]
    index: list[list[Any]]
    data: bytes

    @classmethod
    def of(cls, text: bytes | str, blob: bytes | None, attributes: dict[str, Any] | None = None) -> Unpacked:
        """The stored pair split; `attributes`, the skeleton `text` is the JSON of, stands in
        for parsing `text` (it is read and copied, never changed)."""
        skeleton = orjson.loads(text) if attributes is None else attributes
        if blob is None:
            return cls(skeleton, [], b"")
        split = blob.index(b"\n")
        return cls(skeleton, orjson.loads(blob[:split]), bytes(blob[split + 1 :]))

    def entry(self, path: Path) -> list[Any] | None:
        for entry in self.index:
            if entry[0] == path:
                return entry
        return None

    def ids(self, path: Path) -> bytes | None:
        """The int32 bytes of the id list at `path`, packed or short JSON; None if it is neither."""
        entry = self.entry(path)
        if entry is not None:
            return self.data[entry[1] * 4 : (entry[1] + entry[2]) * 4]
        value = value_at(self.skeleton, path)
        return None if value is NOT_FOUND else int32_bytes(value)

    def choices(self) -> list[tuple[int, bytes]]:
        """(position, generated ids) of each choice with ids."""
        choices = self.skeleton.get(call_span.CHOICES)
        if type(choices) is not list:
            return []
        found = []
        for position in range(len(choices)):
            ids = self.ids([call_span.CHOICES, position, "token_ids"])
            if ids:
                found.append((position, ids))
        return found

    def messages(self) -> list[Any] | None:
        """The request's messages, when they are a list holding no packed ids."""
        request = self.skeleton.get(call_span.REQUEST)
        messages = request.get("messages") if type(request) is dict else None
        if type(messages) is not list:
            return None
        if any(entry[0][:2] == list(MESSAGES_PATH) for entry in self.index):
            return None
        return messages

    def blob(self) -> bytes | None:
        if not self.index:
            return None
        return orjson.dumps(self.index) + b"\n" + self.data

    def text(self) -> bytes:
        return orjson.dumps(self.skeleton)


def _with_value(root: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """A copy of `root` with `value` at `path`; only the containers on the path are copied."""
    top: dict[str, Any] = dict(root)
    node: Any = top
    for key in path[:-1]:
        child = node[key]
        node[key] = child = dict(child) if type(child) is dict else list(child)
        node = child
    node[path[-1]] = value
    return top


def _set_messages(skeleton: dict[str, Any], messages: list[Any]) -> None:
    request = dict(skeleton[call_span.REQUEST])
    request["messages"] = messages
    skeleton[call_span.REQUEST] = request


@dataclass
class Call:
    """What a delta needs of a stored call, whole: its prompt, choices and messages."""

    prompt: bytes | None
    choices: dict[int, bytes]
    messages: list[Any] | None
    _messages_json: bytes | None = field(default=None, repr=False, compare=False)

    def context(self, choice: int | None) -> bytes:
        return (self.prompt or b"") + (self.choices.get(choice, b"") if choice is not None else b"")

    def messages_json(self) -> bytes:
        """The messages' JSON, made once (the writer compares calls by it)."""
        if self._messages_json is None:
            self._messages_json = orjson.dumps(self.messages)
        return self._messages_json


def _shared_bytes(whole: bytes, start: int, part: bytes) -> int:
    """How many leading ids of `part` `whole` has from byte `start`: a binary search of
    memory comparisons, the first of which settles the usual case (all of them)."""
    n = min(len(whole) - start, len(part)) // 4
    if not n or not whole.startswith(part[:4], start):
        return 0
    if whole.startswith(part[: n * 4], start):
        return n
    low, high = 0, n - 1
    while low < high:
        middle = (low + high + 1) // 2
        if whole.startswith(part[: middle * 4], start):
            low = middle
        else:
            high = middle - 1
    return low


def _shared_messages(call: Call, other: Call) -> int:
    """How many leading messages are the same JSON in both calls."""
    mine, theirs = call.messages, other.messages
    if not mine or not theirs:
        return 0
    if len(theirs) <= len(mine):
        # The usual case, a conversation going on: all of `theirs` is a prefix of `mine`.
        # Then the JSON of `mine` starts with that of `theirs` but its "]", and the next
        # byte ends a value: the first len(theirs) messages are the same JSON values.
        mine_json, theirs_json = call.messages_json(), other.messages_json()
        end = len(theirs_json) - 1
        if mine_json[end : end + 1] in (b",", b"]") and mine_json.startswith(theirs_json[:end]):
            return len(theirs)
    if mine[0] != theirs[0]:
        return 0
    n = min(len(mine), len(theirs))
    if mine[:n] != theirs[:n]:
        low, high = 0, n - 1
        while low < high:
            middle = (low + high + 1) // 2
            if mine[:middle] == theirs[:middle]:
                low = middle
            else:
                high = middle - 1
        n = low
    # Python's == takes 1 for 1.0 and True; the JSON text does not.
    if n and orjson.dumps(mine[:n]) != orjson.dumps(theirs[:n]):
        return 0
    return n


@dataclass
class Candidate:
    """A stored call the index remembers, with its row's `stamp` and its depth of deltas."""

    pk: int
    stamp: bytes
    call: Call
    depth: int
    size: int
    """Roughly the memory the index holds for it: the stored span's size."""
    reach: int = field(init=False)
    """The most ids a prompt could share with its contexts (`best_parent` tries the longest first)."""

    def __post_init__(self) -> None:
        self.reach = (len(self.call.prompt or b"") + max(map(len, self.call.choices.values()), default=0)) // 4


@dataclass
class Delta:
    base_pk: int
    stamp: bytes
    choice: int | None
    prefix: int
    messages: int
    depth: int


@dataclass
class DeltaIndex:
    """Recent calls of recently written attempts, whole, for finding a new call's parent.

    Lives in the writer's thread; a cache only (see the module docstring), bounded by
    `RECENT_CALLS` per attempt and `max_bytes` in all (least recently written attempts go).
    """

    max_bytes: int = 256 * 1024 * 1024
    attempts: OrderedDict[tuple[str, str], list[Candidate]] = field(default_factory=OrderedDict)
    sizes: dict[tuple[str, str], int] = field(default_factory=dict)
    total: int = 0

    def candidates(self, key: tuple[str, str]) -> list[Candidate]:
        found = self.attempts.get(key)
        if found is None:
            return []
        self.attempts.move_to_end(key)
        return found

    def remember(self, key: tuple[str, str], new: list[Candidate]) -> None:
        known = self.attempts.setdefault(key, [])
        self.attempts.move_to_end(key)
        known.extend(new)
        del known[:-RECENT_CALLS]
        size = sum(candidate.size for candidate in known)
        self.total += size - self.sizes.get(key, 0)
        self.sizes[key] = size
        while (self.total > self.max_bytes or len(self.attempts) > MAX_ATTEMPTS) and len(self.attempts) > 1:
            evicted, _ = self.attempts.popitem(last=False)
            self.total -= self.sizes.pop(evicted, 0)

    def forget(self, key: tuple[str, str], pk: int) -> None:
        known = self.attempts.get(key)
        if known is not None:
            known[:] = [candidate for candidate in known if candidate.pk != pk]


_BY_REACH = operator.attrgetter("reach")


def best_parent(call: Call, candidates: Sequence[Candidate]) -> Delta | None:
    """The candidate sharing the longest prompt prefix (then the most messages) with `call`;
    None when none shares anything."""
    prompt = call.prompt or b""
    best: tuple[int, int, int] | None = None
    chosen: Delta | None = None
    first = prompt[:4]
    # Longest context first: once one shares more ids than the next could hold, the rest
    # cannot win, and a conversation's latest call usually settles it alone.
    for candidate in sorted(candidates, key=_BY_REACH, reverse=True):
        if best is not None and min(candidate.reach, len(prompt) // 4) < best[0]:
            break
        theirs = candidate.call.prompt or b""
        shared, choice = (_shared_bytes(prompt, 0, theirs) if first and theirs.startswith(first) else 0), None
        if theirs and shared * 4 == len(theirs):  # the whole prompt: then how much of a choice
            best_more = 0
            for position, ids in candidate.call.choices.items():
                more = _shared_bytes(prompt, len(theirs), ids)
                if more > best_more:
                    choice, best_more = position, more
            shared += best_more
        messages = _shared_messages(call, candidate.call)
        score = (shared, messages, candidate.pk)
        if (shared or messages) and (best is None or score > best):
            best = score
            chosen = Delta(candidate.pk, candidate.stamp, choice, shared, messages, candidate.depth + 1)
    return chosen


def call_of(unpacked: Unpacked, messages_json: bytes | None = None) -> Call | None:
    """The call parts of a whole span's attributes; None for a span that is not a call.
    `messages_json`, when given, is the JSON of the request's messages in `unpacked`."""
    prompt = unpacked.ids(_PROMPT_PATH)
    messages = unpacked.messages()
    if prompt is None and messages is None:
        return None
    return Call(prompt, dict(unpacked.choices()), messages, messages_json if messages is not None else None)


def encode_delta(unpacked: Unpacked, call: Call, delta: Delta) -> tuple[bytes, bytes | None, bytes]:
    """The stored (attributes text, blob, delta JSON) of `call` as `delta`."""
    prompt = call.prompt or b""
    tail = prompt[delta.prefix * 4 :]
    prompt_entry = unpacked.entry(_PROMPT_PATH)
    prompt_paths: list[Path] = []
    index: list[list[Any]] = []
    for entry in unpacked.index:
        if prompt_entry is not None and entry[1:] == prompt_entry[1:]:
            if entry[0] != _PROMPT_PATH:
                prompt_paths.append(entry[0])
            continue
        index.append(entry)
    skeleton = dict(unpacked.skeleton)
    if call.prompt is not None:
        skeleton[call_span.PROMPT_TOKEN_IDS] = None
        index.append([_PROMPT_PATH, 0, 0])  # placed after the repack below
    if delta.messages:
        _set_messages(skeleton, (call.messages or [])[delta.messages :])
    # The whole prompt's ids are dropped from the data; the tail goes last.
    stored = _repacked(skeleton, index[:-1] if call.prompt is not None else index, unpacked.data)
    if call.prompt is not None:
        stored.index.append([_PROMPT_PATH, len(stored.data) // 4, len(tail) // 4])
        stored.data += tail
    info = {
        "choice": delta.choice,
        "prefix": delta.prefix if call.prompt is not None else None,
        "messages": delta.messages,
        "prompt_paths": prompt_paths,
        "depth": delta.depth,
    }
    return stored.text(), stored.blob(), orjson.dumps(info)


def _repacked(skeleton: dict[str, Any], index: list[list[Any]], data: bytes) -> Unpacked:
    """`index` over a copy of `data` holding only the ranges it names."""
    moved: dict[tuple[int, int], int] = {}
    parts: list[bytes] = []
    size = 0
    new_index = []
    for path, offset, count in index:
        where = moved.get((offset, count))
        if where is None:
            where = moved[(offset, count)] = size
            parts.append(data[offset * 4 : (offset + count) * 4])
            size += count
        new_index.append([path, where, count])
    return Unpacked(skeleton, new_index, b"".join(parts))


def decode_delta(text: bytes | str, blob: bytes | None, info: dict[str, Any], parent: Call) -> tuple[Unpacked, Call]:
    """A stored delta back as whole attributes, and its call parts."""
    stored = Unpacked.of(text, blob)
    skeleton = stored.skeleton
    prompt: bytes | None = None
    index = stored.index
    data = stored.data
    if info["prefix"] is not None:
        entry = stored.entry(_PROMPT_PATH)
        assert entry is not None
        tail = data[entry[1] * 4 : (entry[1] + entry[2]) * 4]
        prompt = parent.context(info["choice"])[: info["prefix"] * 4] + tail
        if entry[1] * 4 + len(tail) == len(data):
            data = data[: entry[1] * 4]
        index = [e for e in index if e is not entry]
        paths = [_PROMPT_PATH, *info["prompt_paths"]]
        if len(prompt) // 4 >= MIN_PACKED_LENGTH:
            where = len(data) // 4
            data += prompt
            index.extend([path, where, len(prompt) // 4] for path in paths)
        else:  # as `pack_attributes` keeps a short list: JSON
            ints = array("i")
            ints.frombytes(prompt)
            if not _LITTLE_ENDIAN:
                ints.byteswap()
            for path in paths:
                skeleton = _with_value(skeleton, path, ints.tolist())
    messages = None
    if info["messages"]:
        messages = (parent.messages or [])[: info["messages"]] + list(skeleton[call_span.REQUEST]["messages"])
        skeleton = dict(skeleton)
        _set_messages(skeleton, messages)
    whole = Unpacked(skeleton, index, data)
    if messages is None:
        messages = whole.messages()
    return whole, Call(prompt, dict(whole.choices()), messages)


ANCESTORS_SQL = (
    "WITH RECURSIVE chain(pk) AS (SELECT value FROM json_each(?) "
    "UNION SELECT s.base_pk FROM spans s JOIN chain c ON s.pk = c.pk WHERE s.base_pk IS NOT NULL) "
    "SELECT pk, base_pk, delta, attributes, tokens FROM spans WHERE pk IN chain ORDER BY pk"
)
"""The listed spans and all their ancestors, oldest first, in one query."""


Row = Sequence[Any]
"""`SPAN_COLUMNS` then pk, base_pk, delta (what `select_spans` reads)."""
_PK, _BASE, _DELTA = 13, 14, 15
_ATTRIBUTES, _TOKENS = 10, 11


def materialise(conn: sqlite3.Connection, rows: list[Row]) -> list[Row]:
    """`rows` with every delta rebuilt into whole attributes; the parents a page lacks are
    read in one query."""
    if all(row[_BASE] is None for row in rows):
        return rows
    stored: dict[int, tuple[Any, bytes | None, bytes | str, bytes | None]] = {
        row[_PK]: (row[_BASE], row[_DELTA], row[_ATTRIBUTES], row[_TOKENS]) for row in rows
    }
    missing = [row[_BASE] for row in rows if row[_BASE] is not None and row[_BASE] not in stored]
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
        rebuilt = whole.get(row[_PK])
        if rebuilt is None:
            out.append(row)
        else:
            out.append((*row[:_ATTRIBUTES], rebuilt.text(), rebuilt.blob(), *row[_TOKENS + 1 :]))
    return out


def compact(conn: sqlite3.Connection, rows: list[Row]) -> list[Row]:
    """`rows` as stored, each delta's attributes with `agl.delta` naming its parent
    (`call_span.CallDelta`)."""
    parents = [row[_BASE] for row in rows if row[_BASE] is not None]
    if not parents:
        return rows
    span_ids = dict(
        conn.execute(
            "SELECT pk, span_id FROM spans WHERE pk IN (SELECT value FROM json_each(?))", (orjson.dumps(parents),)
        )
    )
    out: list[Row] = []
    for row in rows:
        if row[_BASE] is None:
            out.append(row)
            continue
        info = orjson.loads(row[_DELTA])
        reference = {
            "parent": span_ids[row[_BASE]],
            "choice": info["choice"],
            "prefix": info["prefix"],
            "messages": info["messages"],
        }
        text = row[_ATTRIBUTES]
        text = text if isinstance(text, bytes) else text.encode()
        spliced = text[:-1] + b',"' + call_span.DELTA.encode() + b'":' + orjson.dumps(reference) + b"}"
        out.append((*row[:_ATTRIBUTES], spliced, *row[_ATTRIBUTES + 1 :]))
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
        text = row[_ATTRIBUTES]
        text = text.decode() if isinstance(text, bytes) else text  # SQLite 3.45+ reads a blob as JSONB
        kept = _kept_json(conn, text, listed, keys)
        if kept is None:
            out.append(row)
            continue
        blob = row[_TOKENS]
        if blob is not None:
            stored = Unpacked.of(b"", blob, {})
            blob = _repacked({}, [entry for entry in stored.index if entry[0][0] in keys], stored.data).blob()
        out.append((*row[:_ATTRIBUTES], kept, blob, *row[_TOKENS + 1 :]))
    return out


RECENT_SQL = (
    "SELECT pk, stamp FROM spans WHERE rollout_id = ? AND attempt_id = ? AND stamp IS NOT NULL ORDER BY pk DESC LIMIT ?"
)
_SPAN_SQL = (
    "SELECT rollout_id, attempt_id, sequence_id, trace_id, span_id, parent_id, name, start_time, end_time, "
    "status_code, attributes, tokens, rest, pk, base_pk, delta FROM spans WHERE pk IN (SELECT value FROM json_each(?))"
)


def _load_recent(conn: sqlite3.Connection, key: tuple[str, str]) -> list[Candidate]:
    """The index entries of an attempt's latest stored calls, read back from the database
    (after a restart, an eviction, or calls another process wrote)."""
    stamps = dict(conn.execute(RECENT_SQL, (*key, RECENT_CALLS)).fetchall())
    if not stamps:
        return []
    rows = materialise(conn, conn.execute(_SPAN_SQL, (orjson.dumps(list(stamps)),)).fetchall())
    found: list[Candidate] = []
    for row in sorted(rows, key=lambda r: r[_PK]):
        call = call_of(Unpacked.of(row[_ATTRIBUTES], row[_TOKENS]))
        if call is not None:
            depth = orjson.loads(row[_DELTA])["depth"] if row[_DELTA] is not None else 0
            size = len(row[_ATTRIBUTES]) + len(row[_TOKENS] or b"")
            found.append(Candidate(row[_PK], stamps[row[_PK]], call, depth, size))
    return found


class DeltaWriter:
    """Turns call rows into deltas inside one write transaction, and remembers the calls it
    stored for the next ones (`DeltaIndex`).

    With `check`, a parent from the index is checked against its row before use; without,
    the parents are only collected (`unchecked`) and the caller checks them all at once
    (`forget_stale`) before inserting, or in the insert itself.
    """

    def __init__(self, conn: sqlite3.Connection, index: DeltaIndex, *, check: bool = True) -> None:
        self.conn = conn
        self.index = index
        self.check = check
        self.pending: dict[int, bytes] = {}  # pk -> stamp of rows this write inserts
        self.unchecked: dict[int, tuple[tuple[str, str], bytes]] = {}  # parent pk -> (attempt, stamp)
        self.remembered: list[tuple[tuple[str, str], int]] = []

    def _valid(self, key: tuple[str, str], delta: Delta) -> bool:
        """Whether the parent's row is still the one the index saw (not rolled back, deleted,
        or replaced by another row at its pk); without `check`, a parent not of this write
        is taken as valid and collected in `unchecked`."""
        stamp = self.pending.get(delta.base_pk)
        if stamp is None and not self.check:
            self.unchecked[delta.base_pk] = (key, delta.stamp)
            return True
        if stamp is None:
            row = self.conn.execute(
                "SELECT stamp FROM spans WHERE pk = ? AND rollout_id = ? AND attempt_id = ?", (delta.base_pk, *key)
            ).fetchone()
            stamp = row[0] if row is not None else None
        return stamp == delta.stamp

    def forget_stale(self) -> bool:
        """Check the `unchecked` parents in one query; whether any had changed (those are
        forgotten by the index: the rows encoded since must be encoded again)."""
        if not self.unchecked:
            return False
        found = {
            pk: (rollout_id, attempt_id, stamp)
            for pk, rollout_id, attempt_id, stamp in self.conn.execute(
                "SELECT pk, rollout_id, attempt_id, stamp FROM spans WHERE pk IN (SELECT value FROM json_each(?))",
                (orjson.dumps(list(self.unchecked)),),
            )
        }
        stale = False
        for pk, (key, stamp) in self.unchecked.items():
            if found.get(pk) != (*key, stamp):
                self.index.forget(key, pk)
                stale = True
        return stale

    def forget_remembered(self) -> None:
        """The rows this writer remembered did not go in: the index forgets them."""
        for key, pk in self.remembered:
            self.index.forget(key, pk)
        self.remembered.clear()

    def encode(
        self,
        key: tuple[str, str],
        skeleton: dict[str, Any],
        text: bytes | str,
        blob: bytes | None,
        pk: int | None,
        messages_json: bytes | None = None,
    ) -> tuple[tuple[Any, ...], Candidate | None]:
        """(attributes, tokens, base_pk, delta, stamp) to store for a span row whose stored
        pair is `text` (the JSON of `skeleton`, which is not changed) and `blob`, and the call
        as the index will know it: remembered now when `pk` is known, else by the caller once
        the row is in (`remember`). `messages_json` is the JSON of the skeleton's request
        messages, if made already."""
        if call_span.PROMPT_TOKEN_IDS not in skeleton and call_span.REQUEST not in skeleton:
            return (text, blob, None, None, None), None
        given = Unpacked.of(text, blob, skeleton)
        call = call_of(given, messages_json)
        if call is None:
            return (text, blob, None, None, None), None
        if key not in self.index.attempts:
            self.index.remember(key, _load_recent(self.conn, key))
        candidates = list(self.index.candidates(key))
        stored: tuple[Any, ...] = (text, blob, None, None)
        depth = 0
        while candidates:
            delta = best_parent(call, candidates)
            if delta is None:
                break
            if not self._valid(key, delta):
                candidates = [c for c in candidates if c.pk != delta.base_pk]
                self.index.forget(key, delta.base_pk)
                continue
            if delta.depth < MAX_DEPTH:
                depth = delta.depth
                stored_text, tokens, info = encode_delta(given, call, delta)
                stored = (stored_text, tokens, delta.base_pk, info)
            break
        # A new stamp per row (this process's random prefix, then a count): a row rolled back
        # and another stored at its pk, by this process or another, differ.
        stamp = _STAMP_PREFIX + next(_STAMPS).to_bytes(8, "little")
        size = len(text) + len(blob or b"") + len(call._messages_json or b"")
        candidate = Candidate(pk or 0, stamp, call, depth, size)
        if pk is not None:
            self.remember(key, candidate, pk)
        return (*stored, stamp), candidate

    def remember(self, key: tuple[str, str], candidate: Candidate, pk: int) -> None:
        """`candidate`'s row went in at `pk`: later calls (of this write too) may extend it."""
        candidate.pk = pk
        self.pending[pk] = candidate.stamp
        self.remembered.append((key, pk))
        self.index.remember(key, [candidate])
