"""The SQLiteStore's operations: plain functions run whole on the connection's thread.

Readers take the `sqlite3.Connection`; writers take a `Txn` and run inside `atomic()`, so
each is one transaction and sees no other writer. The status rules come from
`agl_store.transitions`; `_move_rollout` and `_change_attempt` are the only places that change
a status, keeping the queue, end times, workers and waiters in step.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar, cast

import orjson

from ..base import UNSET
from ..bounds import MAX_INTEGER
from ..errors import ConflictError, NotFoundError
from ..models import (
    LATEST_ATTEMPT,
    QUEUED_ROLLOUT_STATUSES,
    TERMINAL_ROLLOUT_STATUSES,
    Attempt,
    AttemptedRollout,
    NamedResources,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    Span,
    Worker,
    new_id,
)
from ..pages import Page, page_total
from .schema import (
    ATTEMPT_COLUMNS,
    RESOURCES_COLUMNS,
    ROLLOUT_COLUMNS,
    ROLLOUT_COUNT_PREFIX,
    ROLLOUT_SELECT,
    SPAN_COLUMNS,
    WORKER_COLUMNS,
    attempt_from_row,
    resources_from_row,
    rollout_from_row,
    span_from_row,
    worker_from_row,
)
from ..transitions import (
    ATTEMPT_END_STATUSES,
    check_attempt_move,
    rollout_status_from_attempt,
    worker_status_for_attempt,
)

T = TypeVar("T")

UNATTRIBUTED_ROLLOUT_ID = ""
"""Spans of calls made without rollout ids: stored without a rollout or attempt row."""

_TERMINAL_SQL = "(" + ", ".join(f"'{status}'" for status in sorted(TERMINAL_ROLLOUT_STATUSES)) + ")"


@contextlib.contextmanager
def atomic(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: `BEGIN IMMEDIATE` takes the write lock up front (waiting up to
    the busy timeout for other processes), so a transaction never fails half-way on a lock."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        # SQLite may already have rolled back (e.g. a full disk); never mask the real error.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class Txn:
    """What a write function needs: the connection, one clock reading, and the rollouts it
    finished (the store wakes `wait_for_rollouts` for them after the commit)."""

    __slots__ = ("conn", "now", "finished")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.now = time.time()
        self.finished: List[str] = []


class PagedQuery:
    """A checked, paged SELECT: its rows, and the count of matches before paging."""

    __slots__ = ("select", "count", "where", "params", "order", "limit", "offset")

    def __init__(
        self, *, select: str, count: str, where: str, params: List[Any], order: str, limit: int, offset: int
    ) -> None:
        self.select, self.count, self.where, self.params = select, count, where, params
        self.order, self.limit, self.offset = order, limit, offset


class NewRollout:
    """A validated rollout about to be inserted, with its JSON columns encoded."""

    __slots__ = ("rollout", "row_input", "row_config", "row_metadata")

    def __init__(self, rollout: Rollout, row_input: bytes, row_config: bytes, row_metadata: bytes) -> None:
        self.rollout = rollout
        self.row_input, self.row_config, self.row_metadata = row_input, row_config, row_metadata


class EncodedSpan:
    """A validated span and its `SPAN_COLUMNS` row."""

    __slots__ = ("span", "row")

    def __init__(self, span: Span, row: tuple) -> None:
        self.span = span
        self.row = row


class AttemptChanges:
    """The fields of an `update_attempt` call; UNSET where not given."""

    __slots__ = ("status", "worker_id", "last_heartbeat_time", "metadata")

    def __init__(self, status: Any, worker_id: Any, last_heartbeat_time: Any, metadata: Any) -> None:
        self.status, self.worker_id = status, worker_id
        self.last_heartbeat_time, self.metadata = last_heartbeat_time, metadata


WriteOutcome = Tuple[bool, Any, Sequence[str]]
"""(succeeded, its return value or exception, rollouts it finished)."""


def run_writes(
    conn: sqlite3.Connection, writes: Sequence[Tuple[Callable[..., Any], Tuple[Any, ...]]]
) -> List[WriteOutcome]:
    """Run write functions `fn(txn, *args)` in one transaction, each in its own savepoint,
    so a failing one leaves no trace and the others still commit. An error of the
    transaction itself (BEGIN, COMMIT) propagates: then nothing was written."""
    if len(writes) == 1:  # the common case needs no savepoint
        fn, args = writes[0]
        txn = Txn(conn)
        try:
            with atomic(conn):
                value = fn(txn, *args)
        except Exception as exc:  # rolled back by atomic()
            return [(False, exc, ())]
        return [(True, value, txn.finished)]
    outcomes: List[WriteOutcome] = []
    with atomic(conn):
        for fn, args in writes:
            txn = Txn(conn)
            conn.execute("SAVEPOINT write")
            try:
                value = fn(txn, *args)
            except Exception as exc:
                conn.execute("ROLLBACK TO write")
                conn.execute("RELEASE write")
                outcomes.append((False, exc, ()))
            else:
                conn.execute("RELEASE write")
                outcomes.append((True, value, txn.finished))
    return outcomes


# === operations (run on the connection thread) ===============================================
# Readers take the sqlite3 connection; writers take a Txn and run inside `atomic()`.


def _fetchone(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    return conn.execute(sql, params).fetchone()


def _next_counter(conn: sqlite3.Connection, name: str, by: int = 1) -> int:
    """Advance a shared counter by `by`; returns its new value (the last one issued)."""
    return conn.execute(
        "INSERT INTO counters (name, value) VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value RETURNING value",
        (name, by),
    ).fetchall()[0][0]


def get_rollout(conn: sqlite3.Connection, rollout_id: str) -> Optional[Rollout]:
    row = _fetchone(conn, ROLLOUT_SELECT + " WHERE r.rollout_id = ?", (rollout_id,))
    return None if row is None else rollout_from_row(row)


def _rollout_columns(conn: sqlite3.Connection, rollout_id: str, columns: str) -> Any:
    """The named columns of a rollout's row; NotFoundError when there is no such rollout."""
    row = _fetchone(conn, f"SELECT {columns} FROM rollouts WHERE rollout_id = ?", (rollout_id,))
    if row is None:
        raise NotFoundError(f"rollout {rollout_id!r} not found")
    return row


def _require_rollout(conn: sqlite3.Connection, rollout_id: str) -> Rollout:
    rollout = get_rollout(conn, rollout_id)
    if rollout is None:
        raise NotFoundError(f"rollout {rollout_id!r} not found")
    return rollout


def get_rollouts(conn: sqlite3.Connection, rollout_ids: List[str]) -> Dict[str, Rollout]:
    rows = conn.execute(
        ROLLOUT_SELECT + " WHERE r.rollout_id IN (SELECT value FROM json_each(?))", (orjson.dumps(rollout_ids),)
    ).fetchall()
    return {row[0]: rollout_from_row(row) for row in rows}


def rollout_statuses(conn: sqlite3.Connection, rollout_ids: List[str]) -> Dict[str, str]:
    """The status of each listed rollout the store knows; unknown ids are left out."""
    rows = conn.execute(
        "SELECT rollout_id, status FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))",
        (orjson.dumps(rollout_ids),),
    ).fetchall()
    return dict(rows)


def get_latest_attempt(conn: sqlite3.Connection, rollout_id: str) -> Optional[Attempt]:
    (latest_id,) = _rollout_columns(conn, rollout_id, "latest_attempt_id")
    if latest_id is None:
        return None
    return _get_attempt(conn, rollout_id, latest_id)


def _resolve_attempt_id(rollout_id: str, attempt_id: str, latest_id: Optional[str]) -> str:
    """`attempt_id`, or the rollout's latest attempt for `"latest"` (NotFoundError if it has none)."""
    if attempt_id != LATEST_ATTEMPT:
        return attempt_id
    if latest_id is None:
        raise NotFoundError(f"rollout {rollout_id!r} has no attempts")
    return latest_id


def _get_attempt(conn: sqlite3.Connection, rollout_id: str, attempt_id: str) -> Optional[Attempt]:
    row = _fetchone(
        conn,
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts a WHERE a.rollout_id = ? AND a.attempt_id = ?",
        (rollout_id, attempt_id),
    )
    return None if row is None else attempt_from_row(row)


def run_paged(conn: sqlite3.Connection, query: PagedQuery, decode: Callable[[Any], T]) -> Page[T]:
    rows = conn.execute(
        query.select + query.where + query.order + " LIMIT ? OFFSET ?", (*query.params, query.limit, query.offset)
    ).fetchall()
    total = page_total(len(rows), query.limit, query.offset)
    if total is None:
        total = conn.execute(query.count + query.where, query.params).fetchone()[0]
    return Page([decode(row) for row in rows], total)


def query_spans(
    conn: sqlite3.Connection, query: PagedQuery, latest: bool, decode: Callable[[Any], T] = span_from_row
) -> Page[T]:
    """The matching spans, each row through `decode` (the server passes a row-to-JSON one)."""
    if latest:
        row = _fetchone(conn, "SELECT latest_attempt_id FROM rollouts WHERE rollout_id = ?", (query.params[0],))
        if row is None or row[0] is None:
            return Page([], 0)
        query.params[1] = row[0]
    return run_paged(conn, query, decode)


def _insert_rollout(
    txn: Txn, new: NewRollout, status: str, queue_seq: Optional[int], attempt: Optional[Attempt]
) -> None:
    rollout = new.rollout
    config = rollout.config
    txn.conn.execute(
        "INSERT INTO rollouts (rollout_id, input, start_time, mode, resources_id, status, config, metadata, "
        "queue_seq, attempt_count, latest_attempt_id, timeout_seconds, unresponsive_seconds) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            rollout.rollout_id,
            new.row_input,
            rollout.start_time,
            rollout.mode,
            rollout.resources_id,
            status,
            new.row_config,
            new.row_metadata,
            queue_seq,
            0 if attempt is None else attempt.sequence_id,
            None if attempt is None else attempt.attempt_id,
            config.timeout_seconds,
            config.unresponsive_seconds,
        ),
    )


def _new_attempt(txn: Txn, rollout_id: str, sequence_id: int, worker_id: Optional[str]) -> Attempt:
    return Attempt(
        rollout_id=rollout_id,
        attempt_id=new_id("at"),
        sequence_id=sequence_id,
        start_time=txn.now,
        status="preparing",
        worker_id=worker_id,
    )


def _insert_attempt(txn: Txn, attempt: Attempt) -> None:
    txn.conn.execute(
        "INSERT INTO attempts (rollout_id, attempt_id, sequence_id, start_time, status, worker_id) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (
            attempt.rollout_id,
            attempt.attempt_id,
            attempt.sequence_id,
            attempt.start_time,
            "preparing",
            attempt.worker_id,
        ),
    )


def _latest_resources_id(conn: sqlite3.Connection) -> Optional[str]:
    row = _fetchone(conn, "SELECT resources_id FROM resources ORDER BY touched DESC LIMIT 1")
    return None if row is None else row[0]


def start_rollout(txn: Txn, new: NewRollout, worker_id: Optional[str]) -> AttemptedRollout:
    rollout = new.rollout
    if rollout.resources_id is None:
        rollout.resources_id = _latest_resources_id(txn.conn)
    attempt = _new_attempt(txn, rollout.rollout_id, 1, worker_id)
    _insert_rollout(txn, new, "preparing", None, attempt)
    _insert_attempt(txn, attempt)
    if worker_id:
        _sync_worker(txn, worker_id, attempt)
    return AttemptedRollout(**{**rollout.__dict__, "status": "preparing"}, attempt=attempt)


def enqueue_rollouts(txn: Txn, news: List[NewRollout]) -> List[Rollout]:
    last = _next_counter(txn.conn, "queue", len(news))
    latest_resources_id = _latest_resources_id(txn.conn)
    out = []
    for position, new in enumerate(news, start=last - len(news) + 1):
        if new.rollout.resources_id is None:
            new.rollout.resources_id = latest_resources_id
        _insert_rollout(txn, new, "queuing", position, None)
        out.append(new.rollout)
    return out


def dequeue(txn: Txn, limit: int, worker_id: Optional[str]) -> List[AttemptedRollout]:
    rows = txn.conn.execute(
        ROLLOUT_SELECT + " WHERE r.queue_seq IS NOT NULL ORDER BY r.queue_seq LIMIT ?", (limit,)
    ).fetchall()
    claimed = []
    for row in rows:
        rollout = rollout_from_row(row)
        previous = rollout.attempt.sequence_id if isinstance(rollout, AttemptedRollout) else 0
        attempt = _new_attempt(txn, rollout.rollout_id, previous + 1, worker_id)
        _insert_attempt(txn, attempt)
        txn.conn.execute(
            "UPDATE rollouts SET status = 'preparing', queue_seq = NULL, attempt_count = ?, latest_attempt_id = ? "
            "WHERE rollout_id = ?",
            (attempt.sequence_id, attempt.attempt_id, rollout.rollout_id),
        )
        fields = {k: v for k, v in dict(rollout).items() if k != "attempt"}
        claimed.append(AttemptedRollout(**{**fields, "status": "preparing"}, attempt=attempt))
    if worker_id:
        if claimed:
            # One worker runs one attempt at a time: it is busy with the last one claimed.
            _sync_worker(txn, worker_id, claimed[-1].attempt, dequeued=True)
        else:
            _mark_worker_idle(txn, worker_id)
    return claimed


def start_attempt(txn: Txn, rollout_id: str, worker_id: Optional[str]) -> AttemptedRollout:
    """A new attempt of any rollout, finished ones included (a manual retry): it is the
    latest, so the rollout is `preparing` and follows it from now on."""
    status, count = _rollout_columns(txn.conn, rollout_id, "status, attempt_count")
    attempt = _new_attempt(txn, rollout_id, count + 1, worker_id)
    _insert_attempt(txn, attempt)
    txn.conn.execute(
        "UPDATE rollouts SET attempt_count = ?, latest_attempt_id = ? WHERE rollout_id = ?",
        (attempt.sequence_id, attempt.attempt_id, rollout_id),
    )
    _move_rollout(txn, rollout_id, status, "preparing")
    if worker_id:
        _sync_worker(txn, worker_id, attempt)
    rollout = _require_rollout(txn.conn, rollout_id)
    assert isinstance(rollout, AttemptedRollout)
    return rollout


def _move_rollout(txn: Txn, rollout_id: str, old: str, new: str) -> None:
    """The one place a rollout's status changes: keeps the queue and `end_time` in step
    (a rollout that runs again is unfinished: no end time), and records finishes for the
    waiters."""
    if old == new:
        return
    conn = txn.conn
    if new in TERMINAL_ROLLOUT_STATUSES:
        conn.execute(
            "UPDATE rollouts SET status = ?, end_time = ?, queue_seq = NULL WHERE rollout_id = ?",
            (new, txn.now, rollout_id),
        )
        txn.finished.append(rollout_id)
    elif new in QUEUED_ROLLOUT_STATUSES and old not in QUEUED_ROLLOUT_STATUSES:
        conn.execute(
            "UPDATE rollouts SET status = ?, queue_seq = ?, end_time = NULL WHERE rollout_id = ?",
            (new, _next_counter(conn, "queue"), rollout_id),
        )
    elif new in QUEUED_ROLLOUT_STATUSES:
        conn.execute("UPDATE rollouts SET status = ? WHERE rollout_id = ?", (new, rollout_id))
    else:
        conn.execute(
            "UPDATE rollouts SET status = ?, queue_seq = NULL, end_time = NULL WHERE rollout_id = ?", (new, rollout_id)
        )


def update_rollout(txn: Txn, rollout_id: str, columns: Dict[str, Any], status: Any) -> Rollout:
    (old,) = _rollout_columns(txn.conn, rollout_id, "status")
    if status is not UNSET:
        _move_rollout(txn, rollout_id, old, status)
    if columns:
        assignments = ", ".join(f"{column} = ?" for column in columns)
        txn.conn.execute(f"UPDATE rollouts SET {assignments} WHERE rollout_id = ?", (*columns.values(), rollout_id))
    return _require_rollout(txn.conn, rollout_id)


def update_attempt(txn: Txn, rollout_id: str, attempt_id: str, changes: AttemptChanges) -> Attempt:
    rollout_status, config, latest_id = _rollout_columns(txn.conn, rollout_id, "status, config, latest_attempt_id")
    attempt_id = _resolve_attempt_id(rollout_id, attempt_id, latest_id)
    attempt = _get_attempt(txn.conn, rollout_id, attempt_id)
    if attempt is None:
        raise NotFoundError(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found")
    return _change_attempt(
        txn, attempt, rollout_status, RolloutConfig.model_validate(orjson.loads(config)), latest_id, changes
    )


def _change_attempt(
    txn: Txn,
    attempt: Attempt,
    rollout_status: str,
    config: RolloutConfig,
    latest_id: Optional[str],
    changes: AttemptChanges,
) -> Attempt:
    """The one place an attempt's status changes, with propagation to rollout and worker."""
    updates: Dict[str, Any] = {}
    status = changes.status
    if status is not UNSET:
        check_attempt_move(attempt.rollout_id, attempt.attempt_id, attempt.status, status)
        if status != attempt.status:
            updates["status"] = status
            updates["end_time"] = txn.now if status in ATTEMPT_END_STATUSES else None
    if changes.worker_id is not UNSET:
        updates["worker_id"] = changes.worker_id
    if changes.last_heartbeat_time is not UNSET:
        updates["last_heartbeat_time"] = float(changes.last_heartbeat_time)
    if changes.metadata is not UNSET:
        updates["metadata"] = changes.metadata
    new = attempt.model_copy(update=updates)
    txn.conn.execute(
        "UPDATE attempts SET status = ?, end_time = ?, worker_id = ?, last_heartbeat_time = ?, metadata = ? "
        "WHERE rollout_id = ? AND attempt_id = ?",
        (
            new.status,
            new.end_time,
            new.worker_id,
            new.last_heartbeat_time,
            None if new.metadata is None else orjson.dumps(new.metadata),
            new.rollout_id,
            new.attempt_id,
        ),
    )
    if status is not UNSET and new.attempt_id == latest_id and rollout_status not in TERMINAL_ROLLOUT_STATUSES:
        target = rollout_status_from_attempt(new.status, new.sequence_id, config)
        _move_rollout(txn, new.rollout_id, rollout_status, target)
    if new.worker_id and (status is not UNSET or changes.worker_id is not UNSET):
        _sync_worker(txn, new.worker_id, new)
    return new


def _sync_worker(txn: Txn, worker_id: str, attempt: Attempt, dequeued: bool = False) -> None:
    """Set a worker's status from the attempt it runs (agent-lightning's rule)."""
    status = worker_status_for_attempt(attempt.status)
    busy = status == "busy"
    txn.conn.execute(
        "INSERT INTO workers (worker_id, status, last_busy_time, last_idle_time, last_dequeue_time, "
        "current_rollout_id, current_attempt_id) VALUES (?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (worker_id) DO UPDATE SET status = excluded.status, "
        "last_busy_time = coalesce(excluded.last_busy_time, last_busy_time), "
        "last_idle_time = coalesce(excluded.last_idle_time, last_idle_time), "
        "last_dequeue_time = coalesce(excluded.last_dequeue_time, last_dequeue_time), "
        "current_rollout_id = excluded.current_rollout_id, current_attempt_id = excluded.current_attempt_id",
        (
            worker_id,
            status,
            txn.now if busy else None,
            None if busy else txn.now,
            txn.now if dequeued else None,
            attempt.rollout_id if busy else None,
            attempt.attempt_id if busy else None,
        ),
    )


def _mark_worker_idle(txn: Txn, worker_id: str) -> None:
    """A dequeue that found nothing: the worker is idle (since now, unless it already was)."""
    txn.conn.execute(
        "INSERT INTO workers (worker_id, status, last_idle_time, last_dequeue_time) VALUES (?, 'idle', ?, ?) "
        "ON CONFLICT (worker_id) DO UPDATE SET "
        "last_idle_time = CASE WHEN status = 'idle' THEN last_idle_time ELSE excluded.last_idle_time END, "
        "status = 'idle', last_dequeue_time = excluded.last_dequeue_time, "
        "current_rollout_id = NULL, current_attempt_id = NULL",
        (worker_id, txn.now, txn.now),
    )


def heartbeat_worker(txn: Txn, worker_id: str, stats: Any) -> Worker:
    if stats is UNSET:
        txn.conn.execute(
            "INSERT INTO workers (worker_id, status, last_heartbeat_time) VALUES (?, 'unknown', ?) "
            "ON CONFLICT (worker_id) DO UPDATE SET last_heartbeat_time = excluded.last_heartbeat_time",
            (worker_id, txn.now),
        )
    else:
        txn.conn.execute(
            "INSERT INTO workers (worker_id, status, last_heartbeat_time, heartbeat_stats) VALUES (?, 'unknown', ?, ?) "
            "ON CONFLICT (worker_id) DO UPDATE SET last_heartbeat_time = excluded.last_heartbeat_time, "
            "heartbeat_stats = excluded.heartbeat_stats",
            (worker_id, txn.now, stats),
        )
    worker = get_worker(txn.conn, worker_id)
    assert worker is not None
    return worker


def get_worker(conn: sqlite3.Connection, worker_id: str) -> Optional[Worker]:
    row = _fetchone(conn, f"SELECT {WORKER_COLUMNS} FROM workers WHERE worker_id = ?", (worker_id,))
    return None if row is None else worker_from_row(row)


# --- spans and sequence ids -------------------------------------------------------------------


def _attempt_states(txn: Txn, pairs: Sequence[Tuple[str, str]]) -> Dict[Tuple[str, str], Tuple[str, str, bool]]:
    """(attempt status, rollout status, is latest) of each attributed pair; NotFoundError
    for an unknown rollout or attempt. Unattributed pairs (rollout "") are skipped."""
    states = {}
    for rollout_id, attempt_id in dict.fromkeys(pairs):
        if rollout_id == UNATTRIBUTED_ROLLOUT_ID:
            continue
        row = _fetchone(
            txn.conn,
            "SELECT a.status, r.status, r.latest_attempt_id = a.attempt_id FROM attempts a "
            "JOIN rollouts r ON r.rollout_id = a.rollout_id WHERE a.rollout_id = ? AND a.attempt_id = ?",
            (rollout_id, attempt_id),
        )
        if row is None:
            if _fetchone(txn.conn, "SELECT 1 FROM rollouts WHERE rollout_id = ?", (rollout_id,)) is None:
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


def issue_sequence_ids(txn: Txn, pairs: List[Tuple[str, str]]) -> List[int]:
    # The rollout must exist; its attempt is not checked, as in agent-lightning 0.3: the
    # numbers are per rollout, and callers ask with "latest" or before the attempt is known.
    for rollout_id in dict.fromkeys(rollout_id for rollout_id, _ in pairs):
        if rollout_id != UNATTRIBUTED_ROLLOUT_ID:
            _rollout_columns(txn.conn, rollout_id, "1")
    # Every entry asks for an id, so every entry gets one.
    return cast(List[int], _issue_sequence_ids(txn.conn, [(rollout_id, None) for rollout_id, _ in pairs]))


def _issue_sequence_ids(conn: sqlite3.Connection, wanted: List[Tuple[str, Optional[int]]]) -> List[Optional[int]]:
    """Per `(rollout_id, sequence_id brought or None)`: the id issued for a None, else None.

    Each rollout's counter is first pushed past the ids the spans bring, then advanced once
    by the number of ids it issues, which are handed out in order.
    """
    floors: Dict[str, int] = {}
    missing: Dict[str, int] = {}
    for rid, seq in wanted:
        if seq is None:
            missing[rid] = missing.get(rid, 0) + 1
        else:
            floors[rid] = max(floors.get(rid, 0), seq)
    next_ids = {}
    for rid in floors.keys() | missing.keys():
        count = missing.get(rid, 0)
        next_ids[rid] = _advance_sequence(conn, rid, floors.get(rid, 0), count) - count + 1
    issued: List[Optional[int]] = []
    for rid, seq in wanted:
        if seq is None:
            issued.append(next_ids[rid])
            next_ids[rid] += 1
        else:
            issued.append(None)
    return issued


_SPAN_ROW_SQL = "(" + ", ".join("?" * len(SPAN_COLUMNS.split(","))) + ")"
_INSERT_SPANS = f"INSERT OR IGNORE INTO spans ({SPAN_COLUMNS}) VALUES "
ROWS_PER_INSERT = 256
"""Span rows per INSERT statement (13 parameters each, well under SQLite's 32,766)."""


def _insert_rows(conn: sqlite3.Connection, rows: List[tuple]) -> int:
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


def add_spans(txn: Txn, encoded: List[EncodedSpan]) -> List[Span]:
    conn = txn.conn
    _resolve_latest_attempts(conn, encoded)
    pairs = [(e.span.rollout_id, e.span.attempt_id) for e in encoded]
    states = _attempt_states(txn, pairs)

    issued = _issue_sequence_ids(conn, [(e.span.rollout_id, e.span.sequence_id) for e in encoded])
    rows = [e.row if seq is None else e.row[:2] + (seq,) + e.row[3:] for e, seq in zip(encoded, issued)]

    if len(rows) == 1:
        keep = [_insert_rows(conn, rows) == 1]
    else:
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


def _resolve_latest_attempts(conn: sqlite3.Connection, encoded: List[EncodedSpan]) -> None:
    """Spans sent with attempt id "latest" belong to their rollout's latest attempt: stored
    (and returned) under its id."""
    for e in encoded:
        if e.span.attempt_id == LATEST_ATTEMPT and e.span.rollout_id != UNATTRIBUTED_ROLLOUT_ID:
            (latest_id,) = _rollout_columns(conn, e.span.rollout_id, "latest_attempt_id")
            attempt_id = _resolve_attempt_id(e.span.rollout_id, LATEST_ATTEMPT, latest_id)
            e.span = e.span.model_copy(update={"attempt_id": attempt_id})
            e.row = e.row[:1] + (attempt_id,) + e.row[2:]


def _insert_many(conn: sqlite3.Connection, rows: List[tuple]) -> List[bool]:
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


def _on_heartbeat(txn: Txn, pair: Tuple[str, str], state: Tuple[str, str, bool]) -> None:
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
            _move_rollout(txn, rollout_id, rollout_status, "running")
    else:
        txn.conn.execute(
            "UPDATE attempts SET last_heartbeat_time = ? WHERE rollout_id = ? AND attempt_id = ?",
            (txn.now, rollout_id, attempt_id),
        )


# --- watchdog -----------------------------------------------------------------------------------

_UNHEALTHY_SQL = (
    # Latest attempts of active rollouts past their timeout (since the attempt started) or
    # silent past unresponsive_seconds (since the last heartbeat, or the start if none).
    f"SELECT {ROLLOUT_COLUMNS}, {ATTEMPT_COLUMNS}, "
    "CASE WHEN r.timeout_seconds IS NOT NULL AND :now - a.start_time > r.timeout_seconds "
    "THEN 'timeout' ELSE 'unresponsive' END "
    "FROM rollouts r JOIN attempts a ON a.rollout_id = r.rollout_id AND a.attempt_id = r.latest_attempt_id "
    "WHERE (r.timeout_seconds IS NOT NULL OR r.unresponsive_seconds IS NOT NULL) "
    "AND r.status IN ('preparing', 'running') AND a.status IN ('preparing', 'running') "
    "AND ((r.timeout_seconds IS NOT NULL AND :now - a.start_time > r.timeout_seconds) "
    "OR (r.unresponsive_seconds IS NOT NULL "
    "AND :now - coalesce(a.last_heartbeat_time, a.start_time) > r.unresponsive_seconds))"
)


def any_unhealthy(conn: sqlite3.Connection, now: float) -> bool:
    """Whether `mark_unhealthy` would change anything: the watchdog's check, decoding no rows."""
    return bool(conn.execute(f"SELECT EXISTS ({_UNHEALTHY_SQL})", {"now": now}).fetchone()[0])


def find_unhealthy(conn: sqlite3.Connection, now: float) -> List[Tuple[Rollout, str]]:
    rows = conn.execute(_UNHEALTHY_SQL, {"now": now}).fetchall()
    # Each row is a ROLLOUT_SELECT row, then the status the attempt earned.
    return [(rollout_from_row(row[:-1]), row[-1]) for row in rows]


def mark_unhealthy(txn: Txn) -> int:
    # Re-checked under the write lock: another process may have handled these already.
    marked = find_unhealthy(txn.conn, txn.now)
    for rollout, status in marked:
        assert isinstance(rollout, AttemptedRollout)
        changes = AttemptChanges(status, UNSET, UNSET, UNSET)
        _change_attempt(txn, rollout.attempt, rollout.status, rollout.config, rollout.attempt.attempt_id, changes)
    return len(marked)


# --- resources, statistics, retention -----------------------------------------------------------


def put_resources(txn: Txn, resources_id: str, encoded: Tuple[NamedResources, bytes], update: bool) -> ResourcesUpdate:
    resources, blob = encoded
    touched = _next_counter(txn.conn, "resources")
    row = _fetchone(txn.conn, "SELECT create_time, version FROM resources WHERE resources_id = ?", (resources_id,))
    if row is None:
        create_time, version = txn.now, 1
        txn.conn.execute(
            "INSERT INTO resources (resources_id, create_time, update_time, version, resources, touched) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (resources_id, create_time, txn.now, version, blob, touched),
        )
    elif not update:
        raise ConflictError(f"resources {resources_id!r} already exist")
    else:
        create_time, version = row[0], row[1] + 1
        txn.conn.execute(
            "UPDATE resources SET update_time = ?, version = ?, resources = ?, touched = ? WHERE resources_id = ?",
            (txn.now, version, blob, touched, resources_id),
        )
    return ResourcesUpdate(
        resources_id=resources_id, create_time=create_time, update_time=txn.now, version=version, resources=resources
    )


def get_resources(conn: sqlite3.Connection, resources_id: Optional[str]) -> Optional[ResourcesUpdate]:
    if resources_id is None:
        row = _fetchone(conn, f"SELECT {RESOURCES_COLUMNS} FROM resources ORDER BY touched DESC LIMIT 1")
    else:
        row = _fetchone(conn, f"SELECT {RESOURCES_COLUMNS} FROM resources WHERE resources_id = ?", (resources_id,))
    return None if row is None else resources_from_row(row)


def statistics(conn: sqlite3.Connection) -> Dict[str, Any]:
    """Counts from `row_counts` (kept by triggers, so no table is counted) and free space."""
    counts = dict(conn.execute("SELECT name, value FROM row_counts").fetchall())
    by_status = {
        name[len(ROLLOUT_COUNT_PREFIX) :]: value
        for name, value in counts.items()
        if name.startswith(ROLLOUT_COUNT_PREFIX) and value
    }
    free_pages = conn.execute("PRAGMA freelist_count").fetchone()[0]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    return {
        "total_rollouts": sum(by_status.values()),
        "total_attempts": counts.get("attempts", 0),
        "total_spans": counts.get("spans", 0),
        "total_resources": counts.get("resources", 0),
        "total_workers": counts.get("workers", 0),
        "rollouts_by_status": by_status,
        "unused_bytes": free_pages * page_size,
    }


MAX_ROLLOUTS_PER_CHUNK = 256
"""Rollouts one retention transaction looks at, whatever their span count."""

EXPIRED_ROLLOUTS_SQL = (
    # Through the end-time index: a call with nothing to expire reads one index entry.
    "SELECT rollout_id FROM rollouts INDEXED BY rollouts_end_time "
    f"WHERE end_time < ? AND status IN {_TERMINAL_SQL} ORDER BY end_time LIMIT ?"
)


def finished_rollouts(conn: sqlite3.Connection, ids: List[str]) -> List[str]:
    """The listed rollouts that exist, in order; ConflictError, before anything is deleted,
    when one of them is not finished. A finished rollout never moves again, so this still
    holds while they are deleted, chunk by chunk."""
    statuses = dict(
        conn.execute(
            "SELECT rollout_id, status FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))",
            (orjson.dumps(ids),),
        ).fetchall()
    )
    unfinished = [rid for rid in ids if rid in statuses and statuses[rid] not in TERMINAL_ROLLOUT_STATUSES]
    if unfinished:
        raise ConflictError(f"rollouts not finished, nothing deleted: {unfinished[:10]}")
    return [rid for rid in ids if rid in statuses]


def delete_finished(txn: Txn, ids: List[str], max_spans: int) -> Tuple[int, int]:
    """Delete finished rollouts in order, with their attempts and spans, removing at most
    `max_spans` spans: one bounded transaction of a longer deletion. Returns how many of
    `ids` are done (a prefix) and how many rollouts this removed.

    Spans go first and the rollout last, so an interrupted deletion leaves a finished
    rollout with fewer spans, which the next delete or expire finishes.
    """
    conn = txn.conn
    budget = max_spans
    done = removed = 0
    for rollout_id in ids[:MAX_ROLLOUTS_PER_CHUNK]:
        if budget > 0:
            budget -= conn.execute(
                "DELETE FROM spans WHERE pk IN (SELECT pk FROM spans WHERE rollout_id = ? LIMIT ?)",
                (rollout_id, budget),
            ).rowcount
        if budget <= 0 and _fetchone(conn, "SELECT 1 FROM spans WHERE rollout_id = ? LIMIT 1", (rollout_id,)):
            break
        for table in ("span_counters", "attempts"):
            conn.execute(f"DELETE FROM {table} WHERE rollout_id = ?", (rollout_id,))
        removed += conn.execute(
            f"DELETE FROM rollouts WHERE rollout_id = ? AND status IN {_TERMINAL_SQL}", (rollout_id,)
        ).rowcount
        done += 1
    return done, removed


def any_expired(conn: sqlite3.Connection, ended_before: float) -> bool:
    return conn.execute(f"SELECT EXISTS ({EXPIRED_ROLLOUTS_SQL})", (ended_before, 1)).fetchone()[0] == 1


def expire_finished(txn: Txn, ended_before: float, max_spans: int) -> Tuple[int, bool]:
    """One bounded transaction of `expire_rollouts`: removes the oldest rollouts that finished
    before `ended_before`, at most `max_spans` spans. Returns (rollouts removed, more to do)."""
    ids = [row[0] for row in txn.conn.execute(EXPIRED_ROLLOUTS_SQL, (ended_before, MAX_ROLLOUTS_PER_CHUNK))]
    done, removed = delete_finished(txn, ids, max_spans)
    return removed, done < len(ids) or len(ids) == MAX_ROLLOUTS_PER_CHUNK


def reclaim_space(conn: sqlite3.Connection, max_pages: int) -> bool:
    """Return up to `max_pages` free pages to the file system (files created with
    auto_vacuum=INCREMENTAL), moving pages from the end of the file into free ones. Its own
    transaction, run between writes. Returns whether another call would free more."""
    before = conn.execute("PRAGMA freelist_count").fetchone()[0]
    if not before:
        return False
    # executescript steps the pragma to the end; execute() would free a single page.
    conn.executescript(f"PRAGMA incremental_vacuum({int(max_pages)});")
    after = conn.execute("PRAGMA freelist_count").fetchone()[0]
    return 0 < after < before  # unchanged: a file made without auto_vacuum, nothing to do


def truncate_wal(conn: sqlite3.Connection, wait_ms: int, busy_timeout_ms: int) -> bool:
    """Copy the WAL into the database and truncate the `-wal` file to zero bytes.

    A TRUNCATE checkpoint waits for readers of older snapshots; it waits at most `wait_ms`
    here (then the file keeps its size until the next checkpoint), not the writers' busy
    timeout, since no write can start meanwhile. Returns whether it truncated.
    """
    conn.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
    try:
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    return not busy


def in_snapshot(conn: sqlite3.Connection, read: Callable[..., T], *args: Any) -> T:
    """`read(conn, *args)` in one read transaction: its statements see the same data."""
    conn.execute("BEGIN")
    try:
        return read(conn, *args)
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
