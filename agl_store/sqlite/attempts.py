"""Attempts: creating them, reading them, and `change_attempt`, the one place an attempt's status
changes (propagating to its rollout by `agl_store.transitions`' rules, and to its worker).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ..base import UNSET
from ..errors import NotFoundError
from ..models import LATEST_ATTEMPT, TERMINAL_ROLLOUT_STATUSES, Attempt, RolloutConfig, new_id
from ..transitions import ATTEMPT_END_STATUSES, check_attempt_move, rollout_status_from_attempt
from .rollouts import move_rollout, rollout_columns
from .schema import ATTEMPT_COLUMNS, attempt_from_row, config_from_column
from .transactions import Txn, fetchone
from .workers import sync_worker


class AttemptChanges:
    """The fields of an `update_attempt` call; UNSET where not given. `metadata_json` is the
    metadata as the caller's checks encoded it (`checks.dumps`), None when not given."""

    __slots__ = ("status", "worker_id", "last_heartbeat_time", "metadata", "metadata_json")

    def __init__(
        self,
        status: Any,
        worker_id: Any,
        last_heartbeat_time: Any,
        metadata: Any = UNSET,
        metadata_json: bytes | None = None,
    ) -> None:
        self.status, self.worker_id = status, worker_id
        self.last_heartbeat_time, self.metadata, self.metadata_json = last_heartbeat_time, metadata, metadata_json


def get_latest_attempt(conn: sqlite3.Connection, rollout_id: str) -> Attempt | None:
    (latest_id,) = rollout_columns(conn, rollout_id, "latest_attempt_id")
    if latest_id is None:
        return None
    return _get_attempt(conn, rollout_id, latest_id)


def resolve_attempt_id(rollout_id: str, attempt_id: str, latest_id: str | None) -> str:
    """`attempt_id`, or the rollout's latest attempt for `"latest"` (NotFoundError if it has none)."""
    if attempt_id != LATEST_ATTEMPT:
        return attempt_id
    if latest_id is None:
        raise NotFoundError(f"rollout {rollout_id!r} has no attempts")
    return latest_id


def _get_attempt(conn: sqlite3.Connection, rollout_id: str, attempt_id: str) -> Attempt | None:
    row = fetchone(
        conn,
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts a WHERE a.rollout_id = ? AND a.attempt_id = ?",
        (rollout_id, attempt_id),
    )
    return None if row is None else attempt_from_row(row)


def new_attempt(txn: Txn, rollout_id: str, sequence_id: int, worker_id: str | None) -> Attempt:
    return Attempt(
        rollout_id=rollout_id,
        attempt_id=new_id("at"),
        sequence_id=sequence_id,
        start_time=txn.now,
        status="preparing",
        worker_id=worker_id,
    )


def insert_attempt(txn: Txn, attempt: Attempt) -> None:
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


def update_attempt(txn: Txn, rollout_id: str, attempt_id: str, changes: AttemptChanges) -> Attempt:
    rollout_status, config, latest_id = rollout_columns(txn.conn, rollout_id, "status, config, latest_attempt_id")
    attempt_id = resolve_attempt_id(rollout_id, attempt_id, latest_id)
    attempt = _get_attempt(txn.conn, rollout_id, attempt_id)
    if attempt is None:
        raise NotFoundError(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found")
    return change_attempt(txn, attempt, rollout_status, config_from_column(config), latest_id, changes)


def change_attempt(
    txn: Txn,
    attempt: Attempt,
    rollout_status: str,
    config: RolloutConfig,
    latest_id: str | None,
    changes: AttemptChanges,
) -> Attempt:
    """The one place an attempt's status changes, with propagation to rollout and worker."""
    updates: dict[str, Any] = {}
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
        # Metadata not given keeps its stored bytes: no re-encoding on every status or heartbeat.
        "UPDATE attempts SET status = ?, end_time = ?, worker_id = ?, last_heartbeat_time = ?, "
        "metadata = coalesce(?, metadata) WHERE rollout_id = ? AND attempt_id = ?",
        (
            new.status,
            new.end_time,
            new.worker_id,
            new.last_heartbeat_time,
            changes.metadata_json,
            new.rollout_id,
            new.attempt_id,
        ),
    )
    if status is not UNSET and new.attempt_id == latest_id and rollout_status not in TERMINAL_ROLLOUT_STATUSES:
        target = rollout_status_from_attempt(new.status, new.sequence_id, config)
        move_rollout(txn, new.rollout_id, rollout_status, target)
    if new.worker_id and (status is not UNSET or changes.worker_id is not UNSET):
        sync_worker(txn, new.worker_id, new)
    return new
