"""Rollouts in and out of the queue: start, enqueue, dequeue (FIFO over `queuing` and
`requeuing`), manual retries and `update_rollout`.
"""

from __future__ import annotations

from typing import Any

from ..base import UNSET
from ..models import Attempt, AttemptedRollout, Rollout
from .attempts import insert_attempt, new_attempt
from .resources import latest_resources_id
from .rollouts import move_rollout, require_rollout, rollout_columns
from .schema import ROLLOUT_SELECT, config_columns, rollout_from_row
from .transactions import Txn, next_counter
from .workers import mark_worker_idle, sync_worker


class NewRollout:
    """A validated rollout about to be inserted, with its JSON columns encoded."""

    __slots__ = ("rollout", "row_input", "row_metadata", "config_columns")

    def __init__(self, rollout: Rollout, row_input: bytes, row_metadata: bytes) -> None:
        self.rollout = rollout
        self.row_input, self.row_metadata = row_input, row_metadata
        self.config_columns = config_columns(rollout.config)


def _insert_rollout(txn: Txn, new: NewRollout, status: str, queue_seq: int | None, attempt: Attempt | None) -> None:
    rollout, config = new.rollout, new.config_columns
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
            config["config"],
            new.row_metadata,
            queue_seq,
            0 if attempt is None else attempt.sequence_id,
            None if attempt is None else attempt.attempt_id,
            config["timeout_seconds"],
            config["unresponsive_seconds"],
        ),
    )


def start_rollout(txn: Txn, new: NewRollout, worker_id: str | None) -> AttemptedRollout:
    rollout = new.rollout
    if rollout.resources_id is None:
        rollout.resources_id = latest_resources_id(txn.conn)
    attempt = new_attempt(txn, rollout.rollout_id, 1, worker_id)
    _insert_rollout(txn, new, "preparing", None, attempt)
    insert_attempt(txn, attempt)
    if worker_id:
        sync_worker(txn, worker_id, attempt)
    return AttemptedRollout(**{**rollout.__dict__, "status": "preparing"}, attempt=attempt)


def enqueue_rollouts(txn: Txn, news: list[NewRollout]) -> list[Rollout]:
    last = next_counter(txn.conn, "queue", len(news))
    latest_id = latest_resources_id(txn.conn)
    out = []
    for position, new in enumerate(news, start=last - len(news) + 1):
        if new.rollout.resources_id is None:
            new.rollout.resources_id = latest_id
        _insert_rollout(txn, new, "queuing", position, None)
        out.append(new.rollout)
    return out


def dequeue(txn: Txn, limit: int, worker_id: str | None) -> list[AttemptedRollout]:
    rows = txn.conn.execute(
        ROLLOUT_SELECT + " WHERE r.queue_seq IS NOT NULL ORDER BY r.queue_seq LIMIT ?", (limit,)
    ).fetchall()
    claimed = []
    for row in rows:
        rollout = rollout_from_row(row)
        previous = rollout.attempt.sequence_id if isinstance(rollout, AttemptedRollout) else 0
        attempt = new_attempt(txn, rollout.rollout_id, previous + 1, worker_id)
        insert_attempt(txn, attempt)
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
            sync_worker(txn, worker_id, claimed[-1].attempt, dequeued=True)
        else:
            mark_worker_idle(txn, worker_id)
    return claimed


def start_attempt(txn: Txn, rollout_id: str, worker_id: str | None) -> AttemptedRollout:
    """A new attempt of any rollout, finished ones included (a manual retry): it is the
    latest, so the rollout is `preparing` and follows it from now on."""
    status, count = rollout_columns(txn.conn, rollout_id, "status, attempt_count")
    attempt = new_attempt(txn, rollout_id, count + 1, worker_id)
    insert_attempt(txn, attempt)
    txn.conn.execute(
        "UPDATE rollouts SET attempt_count = ?, latest_attempt_id = ? WHERE rollout_id = ?",
        (attempt.sequence_id, attempt.attempt_id, rollout_id),
    )
    move_rollout(txn, rollout_id, status, "preparing")
    if worker_id:
        sync_worker(txn, worker_id, attempt)
    rollout = require_rollout(txn.conn, rollout_id)
    assert isinstance(rollout, AttemptedRollout)
    return rollout


def update_rollout(txn: Txn, rollout_id: str, columns: dict[str, Any], status: Any) -> Rollout:
    (old,) = rollout_columns(txn.conn, rollout_id, "status")
    if status is not UNSET:
        move_rollout(txn, rollout_id, old, status)
    if columns:
        assignments = ", ".join(f"{column} = ?" for column in columns)
        txn.conn.execute(f"UPDATE rollouts SET {assignments} WHERE rollout_id = ?", (*columns.values(), rollout_id))
    return require_rollout(txn.conn, rollout_id)
