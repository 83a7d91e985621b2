"""Retention: deleting finished rollouts in bounded transactions, then giving the freed pages
back to the file system and truncating the WAL.
"""

from __future__ import annotations

import sqlite3

from ..errors import ConflictError
from ..models import TERMINAL_ROLLOUT_STATUSES
from .rollouts import TERMINAL_SQL, rollout_statuses
from .transactions import Txn, fetchone

MAX_ROLLOUTS_PER_CHUNK = 256
"""Rollouts one retention transaction looks at, whatever their span count."""

EXPIRED_ROLLOUTS_SQL = (
    # Through the end-time index: a call with nothing to expire reads one index entry.
    "SELECT rollout_id FROM rollouts INDEXED BY rollouts_end_time "
    f"WHERE end_time < ? AND status IN {TERMINAL_SQL} ORDER BY end_time LIMIT ?"
)


def finished_rollouts(conn: sqlite3.Connection, ids: list[str]) -> list[str]:
    """The listed rollouts that exist, in order; ConflictError, before anything is deleted,
    when one of them is not finished. A finished rollout never moves again, so this still
    holds while they are deleted, chunk by chunk."""
    statuses = rollout_statuses(conn, ids)
    unfinished = [rid for rid in ids if rid in statuses and statuses[rid] not in TERMINAL_ROLLOUT_STATUSES]
    if unfinished:
        raise ConflictError(f"rollouts not finished, nothing deleted: {unfinished[:10]}")
    return [rid for rid in ids if rid in statuses]


def delete_finished(txn: Txn, ids: list[str], max_spans: int) -> tuple[int, int]:
    """Delete finished rollouts in order, with their attempts and spans, removing at most
    `max_spans` spans: one bounded transaction of a longer deletion. Returns how many of
    `ids` are done (a prefix) and how many rollouts this removed.

    Spans go first, newest first, and the rollout last, so an interrupted deletion leaves a
    finished rollout with fewer spans, which the next delete or expire finishes, and never a
    span stored as a delta without the earlier call it names.
    """
    conn = txn.conn
    budget = max_spans
    done = removed = 0
    for rollout_id in ids[:MAX_ROLLOUTS_PER_CHUNK]:
        if budget > 0:
            budget -= conn.execute(
                "DELETE FROM spans WHERE pk IN (SELECT pk FROM spans WHERE rollout_id = ? ORDER BY pk DESC LIMIT ?)",
                (rollout_id, budget),
            ).rowcount
        if budget <= 0 and fetchone(conn, "SELECT 1 FROM spans WHERE rollout_id = ? LIMIT 1", (rollout_id,)):
            break
        for table in ("span_counters", "attempts"):
            conn.execute(f"DELETE FROM {table} WHERE rollout_id = ?", (rollout_id,))
        removed += conn.execute(
            f"DELETE FROM rollouts WHERE rollout_id = ? AND status IN {TERMINAL_SQL}", (rollout_id,)
        ).rowcount
        done += 1
    return done, removed


def any_expired(conn: sqlite3.Connection, ended_before: float) -> bool:
    return conn.execute(f"SELECT EXISTS ({EXPIRED_ROLLOUTS_SQL})", (ended_before, 1)).fetchone()[0] == 1


def expire_finished(txn: Txn, ended_before: float, max_spans: int) -> tuple[int, bool]:
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
