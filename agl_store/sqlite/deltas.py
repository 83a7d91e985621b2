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

The parts, one module each: the stored form of a delta (`delta_encoder.py`), the index and
the choice of a parent (`delta_index.py`), the reads (`delta_reads.py`), and here the writer
that puts them together inside a write transaction (`DeltaWriter`).
"""

from __future__ import annotations

import itertools
import os
import sqlite3
from typing import Any

import orjson

from .. import call_span
from .delta_encoder import Delta, Unpacked, call_of, encode_delta
from .delta_index import RECENT_CALLS, Candidate, DeltaIndex, best_parent
from .delta_reads import ATTRIBUTES, DELTA, PK, TOKENS, materialise

MAX_DEPTH = 1024
"""A call at this depth of deltas is stored whole again, bounding a chain's length."""
_STAMP_PREFIX = os.urandom(8)
_STAMPS = itertools.count()


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
    for row in sorted(rows, key=lambda r: r[PK]):
        call = call_of(Unpacked.of(row[ATTRIBUTES], row[TOKENS]))
        if call is not None:
            depth = orjson.loads(row[DELTA])["depth"] if row[DELTA] is not None else 0
            found.append(Candidate.of(row[PK], stamps[row[PK]], call, depth))
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
        candidate = Candidate.of(pk or 0, stamp, call, depth)
        if pk is not None:
            self.remember(key, candidate, pk)
        return (*stored, stamp), candidate

    def remember(self, key: tuple[str, str], candidate: Candidate, pk: int) -> None:
        """`candidate`'s row went in at `pk`: later calls (of this write too) may extend it."""
        candidate.pk = pk
        self.pending[pk] = candidate.stamp
        self.remembered.append((key, pk))
        self.index.remember(key, [candidate])
