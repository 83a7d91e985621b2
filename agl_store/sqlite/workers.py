"""Workers: heartbeats, and the status a worker takes from the attempt it runs."""

from __future__ import annotations

import sqlite3
from typing import Any

from ..base import UNSET
from ..models import Attempt, Worker
from ..transitions import worker_status_for_attempt
from .schema import WORKER_COLUMNS, worker_from_row
from .transactions import Txn, fetchone


def sync_worker(txn: Txn, worker_id: str, attempt: Attempt, dequeued: bool = False) -> None:
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


def mark_worker_idle(txn: Txn, worker_id: str) -> None:
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
    """`stats`: the encoded heartbeat stats (bytes, `b"null"` for None), or UNSET to keep the stored ones."""
    txn.conn.execute(
        "INSERT INTO workers (worker_id, status, last_heartbeat_time, heartbeat_stats) VALUES (?, 'unknown', ?, ?) "
        "ON CONFLICT (worker_id) DO UPDATE SET last_heartbeat_time = excluded.last_heartbeat_time, "
        "heartbeat_stats = coalesce(excluded.heartbeat_stats, heartbeat_stats)",
        (worker_id, txn.now, None if stats is UNSET else stats),
    )
    worker = get_worker(txn.conn, worker_id)
    assert worker is not None
    return worker


def get_worker(conn: sqlite3.Connection, worker_id: str) -> Worker | None:
    row = fetchone(conn, f"SELECT {WORKER_COLUMNS} FROM workers WHERE worker_id = ?", (worker_id,))
    return None if row is None else worker_from_row(row)
