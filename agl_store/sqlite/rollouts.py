"""Rollout rows: reading them, and `move_rollout`, the one place a rollout's status changes
(keeping the queue, end times and waiters in step with it).
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from ..errors import NotFoundError
from ..models import QUEUED_ROLLOUT_STATUSES, TERMINAL_ROLLOUT_STATUSES, Rollout
from .schema import ROLLOUT_SELECT, rollout_from_row
from .transactions import Txn, fetchone, next_counter

TERMINAL_SQL = "(" + ", ".join(f"'{status}'" for status in sorted(TERMINAL_ROLLOUT_STATUSES)) + ")"


def get_rollout(conn: sqlite3.Connection, rollout_id: str) -> Rollout | None:
    row = fetchone(conn, ROLLOUT_SELECT + " WHERE r.rollout_id = ?", (rollout_id,))
    return None if row is None else rollout_from_row(row)


def rollout_columns(conn: sqlite3.Connection, rollout_id: str, columns: str) -> Any:
    """The named columns of a rollout's row; NotFoundError when there is no such rollout."""
    row = fetchone(conn, f"SELECT {columns} FROM rollouts WHERE rollout_id = ?", (rollout_id,))
    if row is None:
        raise NotFoundError(f"rollout {rollout_id!r} not found")
    return row


def require_rollout(conn: sqlite3.Connection, rollout_id: str) -> Rollout:
    rollout = get_rollout(conn, rollout_id)
    if rollout is None:
        raise NotFoundError(f"rollout {rollout_id!r} not found")
    return rollout


def get_rollouts(conn: sqlite3.Connection, rollout_ids: list[str]) -> dict[str, Rollout]:
    rows = conn.execute(
        ROLLOUT_SELECT + " WHERE r.rollout_id IN (SELECT value FROM json_each(?))", (orjson.dumps(rollout_ids),)
    ).fetchall()
    return {row[0]: rollout_from_row(row) for row in rows}


def rollout_statuses(conn: sqlite3.Connection, rollout_ids: list[str]) -> dict[str, str]:
    """The status of each listed rollout the store knows; unknown ids are left out."""
    rows = conn.execute(
        "SELECT rollout_id, status FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))",
        (orjson.dumps(rollout_ids),),
    ).fetchall()
    return dict(rows)


def move_rollout(txn: Txn, rollout_id: str, old: str, new: str) -> None:
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
            (new, next_counter(conn, "queue"), rollout_id),
        )
    elif new in QUEUED_ROLLOUT_STATUSES:
        conn.execute("UPDATE rollouts SET status = ? WHERE rollout_id = ?", (new, rollout_id))
    else:
        conn.execute(
            "UPDATE rollouts SET status = ?, queue_seq = NULL, end_time = NULL WHERE rollout_id = ?", (new, rollout_id)
        )
