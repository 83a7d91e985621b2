"""Spans and their sequence ids: numbers issued per rollout, batched inserts, and the heartbeat
each span gives its attempt.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, TypeVar, cast

import orjson

from ..bounds import MAX_INTEGER
from ..errors import ConflictError, NotFoundError
from ..models import LATEST_ATTEMPT, Span
from .attempts import resolve_attempt_id
from .delta_index import DeltaIndex
from .deltas import DeltaWriter
from .rollouts import move_rollout, rollout_columns
from .schema import SPAN_COLUMNS
from .transactions import Txn, fetchone

T = TypeVar("T")


UNATTRIBUTED_ROLLOUT_ID = ""
"""Spans of calls made without rollout ids: stored without a rollout or attempt row."""


class EncodedSpan:
    """A validated span, its `SPAN_COLUMNS` row, the attributes skeleton whose JSON the row
    holds and the JSON of its request's messages (`schema.encode_span_row`)."""

    __slots__ = ("span", "row", "skeleton", "messages_json")

    def __init__(
        self, span: Span, row: tuple[Any, ...], skeleton: dict[str, Any], messages_json: bytes | None = None
    ) -> None:
        self.span = span
        self.row = row
        self.skeleton = skeleton
        self.messages_json = messages_json


def _attempt_states(txn: Txn, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, str, bool]]:
    """(attempt status, rollout status, is latest) of each attributed pair; NotFoundError
    for an unknown rollout or attempt. Unattributed pairs (rollout "") are skipped."""
    states = {}
    for rollout_id, attempt_id in dict.fromkeys(pairs):
        if rollout_id == UNATTRIBUTED_ROLLOUT_ID:
            continue
        row = fetchone(
            txn.conn,
            "SELECT a.status, r.status, r.latest_attempt_id = a.attempt_id FROM attempts a "
            "JOIN rollouts r ON r.rollout_id = a.rollout_id WHERE a.rollout_id = ? AND a.attempt_id = ?",
            (rollout_id, attempt_id),
        )
        if row is None:
            if fetchone(txn.conn, "SELECT 1 FROM rollouts WHERE rollout_id = ?", (rollout_id,)) is None:
                raise NotFoundError(f"rollout {rollout_id!r} not found")
            raise NotFoundError(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found")
        states[(rollout_id, attempt_id)] = (row[0], row[1], bool(row[2]))
    return states


def _advance_sequence(conn: sqlite3.Connection, rollout_id: str, floor: int, count: int) -> int:
    """Push the rollout's counter to at least `floor`, then issue `count` numbers after it;
    returns the counter's new value (the last number issued).

    Like a PostgreSQL sequence at its maximum, a counter never issues past `MAX_INTEGER`:
    the caller's transaction fails instead (a span may have brought the largest id)."""
    value = conn.execute(
        "INSERT INTO span_counters (rollout_id, value) VALUES (?, ?) "
        "ON CONFLICT (rollout_id) DO UPDATE SET value = max(value, ?) + ? RETURNING value",
        (rollout_id, floor + count, floor, count),
    ).fetchall()[0][0]
    if count and value > MAX_INTEGER:
        raise ConflictError(
            f"rollout {rollout_id!r} has no sequence ids left: its spans reached {MAX_INTEGER}, the largest one"
        )
    return value


def issue_sequence_ids(txn: Txn, pairs: list[tuple[str, str]]) -> list[int]:
    # The rollout must exist; its attempt is not checked, as in agent-lightning 0.3: the
    # numbers are per rollout, and callers ask with "latest" or before the attempt is known.
    for rollout_id in dict.fromkeys(rollout_id for rollout_id, _ in pairs):
        if rollout_id != UNATTRIBUTED_ROLLOUT_ID:
            rollout_columns(txn.conn, rollout_id, "1")
    # Every entry asks for an id, so every entry gets one.
    return cast(list[int], _issue_sequence_ids(txn.conn, [(rollout_id, None) for rollout_id, _ in pairs]))


def _issue_sequence_ids(conn: sqlite3.Connection, wanted: list[tuple[str, int | None]]) -> list[int | None]:
    """Per `(rollout_id, sequence_id brought or None)`: the id issued for a None, else None.

    Each rollout's counter is first pushed past the ids the spans bring, then advanced once
    by the number of ids it issues, which are handed out in order.
    """
    floors: dict[str, int] = {}
    missing: dict[str, int] = {}
    for rid, seq in wanted:
        if seq is None:
            missing[rid] = missing.get(rid, 0) + 1
        else:
            floors[rid] = max(floors.get(rid, 0), seq)
    next_ids = {}
    for rid in floors.keys() | missing.keys():
        count = missing.get(rid, 0)
        next_ids[rid] = _advance_sequence(conn, rid, floors.get(rid, 0), count) - count + 1
    issued: list[int | None] = []
    for rid, seq in wanted:
        if seq is None:
            issued.append(next_ids[rid])
            next_ids[rid] += 1
        else:
            issued.append(None)
    return issued


_INSERTED_COLUMNS = SPAN_COLUMNS + ", pk, base_pk, delta, stamp"
_SPAN_ROW_SQL = "(" + ", ".join("?" * len(_INSERTED_COLUMNS.split(","))) + ")"


_INSERT_SPANS = f"INSERT OR IGNORE INTO spans ({_INSERTED_COLUMNS}) VALUES "


ROWS_PER_INSERT = 256
"""Span rows per INSERT statement (17 parameters each, well under SQLite's 32,766)."""


def _insert_rows(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
    """Insert span rows, many per statement; how many went in (duplicates are ignored).

    One statement per chunk rather than `executemany` (a step per row): each step releases
    the GIL and has to take it back, and while the event loop thread is busy (a loaded
    proxy with an embedded store) each take-back can wait up to the interpreter's switch
    interval (5 ms).
    """
    inserted = 0
    for start in range(0, len(rows), ROWS_PER_INSERT):
        chunk = rows[start : start + ROWS_PER_INSERT]
        sql = _INSERT_SPANS + ", ".join([_SPAN_ROW_SQL] * len(chunk))
        inserted += conn.execute(sql, [value for row in chunk for value in row]).rowcount
    return inserted


_NOT_DELTA = (None, None, None, None)


def add_spans(txn: Txn, encoded: list[EncodedSpan], deltas: DeltaIndex | None = None) -> list[Span]:
    """Store spans (duplicates ignored); with `deltas`, LLM calls as deltas of earlier calls
    of their attempt (`agl_store.sqlite.deltas`)."""
    conn = txn.conn
    _resolve_latest_attempts(conn, encoded)
    pairs = [(e.span.rollout_id, e.span.attempt_id) for e in encoded]
    states = _attempt_states(txn, pairs)

    issued = _issue_sequence_ids(conn, [(e.span.rollout_id, e.span.sequence_id) for e in encoded])
    rows = [e.row if seq is None else e.row[:2] + (seq,) + e.row[3:] for e, seq in zip(encoded, issued, strict=False)]

    if deltas is not None and len(rows) == 1:
        rows, keep = _one_as_delta(conn, deltas, encoded[0], rows[0])
    elif deltas is not None:
        rows, keep = _many_as_deltas(conn, deltas, encoded, rows)
    elif len(rows) == 1:
        rows = [rows[0] + _NOT_DELTA]
        keep = [_insert_rows(conn, rows) == 1]
    else:
        rows = [row + _NOT_DELTA for row in rows]
        keep = _insert_many(conn, rows)

    stored = []
    touched = set()
    for e, seq, ok in zip(encoded, issued, keep, strict=True):
        if not ok:
            continue
        stored.append(e.span if seq is None else e.span.model_copy(update={"sequence_id": seq}))
        touched.add((e.span.rollout_id, e.span.attempt_id))
    for pair in touched:
        if pair in states:
            _on_heartbeat(txn, pair, states[pair])
    return stored


def _new_spans(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> list[bool]:
    """Which rows are not duplicates of a stored span or of an earlier row: the ones an
    insert keeps. Known before inserting, so a delta never names a row that was ignored."""
    wanted: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        wanted.setdefault((row[0], row[1]), []).append(row[4])
    known: set[tuple[str, str, str]] = set()
    for (rollout_id, attempt_id), span_ids in wanted.items():
        known.update(
            (rollout_id, attempt_id, span_id)
            for (span_id,) in conn.execute(
                "SELECT span_id FROM spans WHERE rollout_id = ? AND attempt_id = ? "
                "AND span_id IN (SELECT value FROM json_each(?))",
                (rollout_id, attempt_id, orjson.dumps(span_ids)),
            )
        )
    keep = []
    for row in rows:
        key = (row[0], row[1], row[4])
        keep.append(key not in known)
        known.add(key)
    return keep


_INSERT_IF_PARENT = (
    _INSERT_SPANS.replace(" VALUES ", " ")
    + "SELECT "
    + ", ".join("?" * len(_INSERTED_COLUMNS.split(",")))
    + " WHERE EXISTS (SELECT 1 FROM spans WHERE pk = ? AND rollout_id = ? AND attempt_id = ? AND stamp = ?)"
)
"""Inserts a span row only if its parent's row is the one the delta index saw."""


def _one_as_delta(
    conn: sqlite3.Connection, index: DeltaIndex, given: EncodedSpan, row: tuple[Any, ...]
) -> tuple[list[tuple[Any, ...]], list[bool]]:
    """`_many_as_deltas` of one row, in one statement: the insert checks the parent's stamp
    (then no row is inserted: a duplicate, or a parent that changed, told apart only then)
    and gives the row its pk."""
    key = (row[0], row[1])
    writer = DeltaWriter(conn, index, check=False)
    while True:
        (attributes, tokens, base_pk, delta, stamp), candidate = writer.encode(
            key, given.skeleton, row[10], row[11], None, given.messages_json
        )
        full = (*row[:10], attributes, tokens, row[12], None, base_pk, delta, stamp)
        if not writer.unchecked:
            cursor = conn.execute(_INSERT_SPANS + _SPAN_ROW_SQL, full)
            break
        [(parent, (_, parent_stamp))] = writer.unchecked.items()
        cursor = conn.execute(_INSERT_IF_PARENT, (*full, parent, *key, parent_stamp))
        if cursor.rowcount == 1 or not writer.forget_stale():
            break  # inserted, or a duplicate span
        writer = DeltaWriter(conn, index)  # this time each parent is checked before use
    inserted = cursor.rowcount == 1
    if inserted and candidate is not None and cursor.lastrowid is not None:
        writer.remember(key, candidate, cursor.lastrowid)
    return [full], [inserted]


def _many_as_deltas(
    conn: sqlite3.Connection, index: DeltaIndex, encoded: list[EncodedSpan], rows: list[tuple[Any, ...]]
) -> tuple[list[tuple[Any, ...]], list[bool]]:
    """Insert the rows, calls as deltas where they can be; the rows with their pk, and which
    went in (duplicates are ignored).

    First as if no row were a duplicate and no parent the index names had changed: the
    parents are then checked in one query, the duplicates by the insert's count, undone if
    there were any. Only then, one query per attempt finds the duplicates first and each
    parent is checked before use.
    """
    next_pk = conn.execute("SELECT coalesce(max(pk), 0) + 1 FROM spans").fetchone()[0]
    writer = DeltaWriter(conn, index, check=False)
    out = _as_deltas(writer, encoded, rows, [True] * len(rows), next_pk)
    if not writer.forget_stale():
        conn.execute("SAVEPOINT deltas")
        if _insert_rows(conn, out) == len(out):
            conn.execute("RELEASE deltas")
            return out, [True] * len(out)
        conn.execute("ROLLBACK TO deltas")
        conn.execute("RELEASE deltas")
    writer.forget_remembered()
    keep = _new_spans(conn, rows)
    out = _as_deltas(DeltaWriter(conn, index), encoded, rows, keep, next_pk)
    _insert_rows(conn, [row for row, ok in zip(out, keep, strict=True) if ok])
    return out, keep


def _as_deltas(
    writer: DeltaWriter,
    encoded: list[EncodedSpan],
    rows: list[tuple[Any, ...]],
    keep: list[bool],
    next_pk: int,
) -> list[tuple[Any, ...]]:
    """The rows with their pk assigned from `next_pk` and, for calls, stored as deltas where
    they can be."""
    out = []
    for given, row, ok in zip(encoded, rows, keep, strict=True):
        if not ok:
            out.append(row + _NOT_DELTA)
            continue
        key = (row[0], row[1])
        (attributes, tokens, base_pk, delta, stamp), _ = writer.encode(
            key, given.skeleton, row[10], row[11], next_pk, given.messages_json
        )
        out.append((*row[:10], attributes, tokens, row[12], next_pk, base_pk, delta, stamp))
        next_pk += 1
    return out


def _resolve_latest_attempts(conn: sqlite3.Connection, encoded: list[EncodedSpan]) -> None:
    """Spans sent with attempt id "latest" belong to their rollout's latest attempt: stored
    (and returned) under its id."""
    for e in encoded:
        if e.span.attempt_id == LATEST_ATTEMPT and e.span.rollout_id != UNATTRIBUTED_ROLLOUT_ID:
            (latest_id,) = rollout_columns(conn, e.span.rollout_id, "latest_attempt_id")
            attempt_id = resolve_attempt_id(e.span.rollout_id, LATEST_ATTEMPT, latest_id)
            e.span = e.span.model_copy(update={"attempt_id": attempt_id})
            e.row = e.row[:1] + (attempt_id,) + e.row[2:]


def _insert_many(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> list[bool]:
    """Insert span rows; which of them went in (duplicates are ignored)."""
    before = conn.execute("SELECT coalesce(max(pk), 0) FROM spans").fetchone()[0]
    if _insert_rows(conn, rows) == len(rows):
        return [True] * len(rows)
    # Some were duplicates: the rows that went in are exactly those past `before`, as we
    # hold the write lock.
    new_keys = set(conn.execute("SELECT rollout_id, attempt_id, span_id FROM spans WHERE pk > ?", (before,)))
    keep, seen = [], set()
    for row in rows:
        key = (row[0], row[1], row[4])
        keep.append(key in new_keys and key not in seen)
        seen.add(key)
    return keep


def _on_heartbeat(txn: Txn, pair: tuple[str, str], state: tuple[str, str, bool]) -> None:
    """A span arrived for an attempt: it is alive; a preparing (or unresponsive) attempt and
    its rollout, if this is its latest attempt, are now running."""
    rollout_id, attempt_id = pair
    attempt_status, rollout_status, is_latest = state
    if attempt_status in ("preparing", "unresponsive"):
        txn.conn.execute(
            "UPDATE attempts SET last_heartbeat_time = ?, status = 'running', end_time = NULL "
            "WHERE rollout_id = ? AND attempt_id = ?",
            (txn.now, rollout_id, attempt_id),
        )
        if is_latest and rollout_status in ("preparing", "queuing", "requeuing"):
            move_rollout(txn, rollout_id, rollout_status, "running")
    else:
        txn.conn.execute(
            "UPDATE attempts SET last_heartbeat_time = ? WHERE rollout_id = ? AND attempt_id = ?",
            (txn.now, rollout_id, attempt_id),
        )
