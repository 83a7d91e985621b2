"""Transactions on the connection's thread: `atomic()` writes, batched writes in savepoints,
reads in one snapshot, and the small helpers every operation uses.

Readers take the `sqlite3.Connection`; writers take a `Txn` and run inside `atomic()`, so
each is one transaction and sees no other writer.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


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
        self.finished: list[str] = []


WriteOutcome = tuple[bool, Any, Sequence[str]]
"""(succeeded, its return value or exception, rollouts it finished)."""


def run_writes(
    conn: sqlite3.Connection, writes: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]
) -> list[WriteOutcome]:
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
    outcomes: list[WriteOutcome] = []
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


def fetchone(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    return conn.execute(sql, params).fetchone()


def next_counter(conn: sqlite3.Connection, name: str, by: int = 1) -> int:
    """Advance a shared counter by `by`; returns its new value (the last one issued)."""
    return conn.execute(
        "INSERT INTO counters (name, value) VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value RETURNING value",
        (name, by),
    ).fetchall()[0][0]


def in_snapshot(conn: sqlite3.Connection, read: Callable[..., T], *args: Any) -> T:
    """`read(conn, *args)` in one read transaction: its statements see the same data."""
    conn.execute("BEGIN")
    try:
        return read(conn, *args)
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
