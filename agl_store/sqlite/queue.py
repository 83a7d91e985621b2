"""Rollouts in and out of the queue: start, enqueue, dequeue (FIFO over `queuing` and
`requeuing`), manual retries and `update_rollout`.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..base import UNSET
from ..errors import ConflictError
from ..models import Attempt, AttemptedRollout, Rollout
from .attempts import insert_attempt, new_attempt
from .resources import latest_resources_id
from .rollouts import move_rollout, require_rollout, rollout_columns
from .schema import (
    ATTEMPT_COLUMNS,
    LATEST_ATTEMPT_JOIN,
    ROLLOUT_COLUMNS,
    ROLLOUT_SELECT,
    config_columns,
    rollout_from_row,
)
from .transactions import Txn, next_counter
from .workers import mark_worker_idle, sync_worker


class NewRollout:
    """A validated rollout about to be inserted, with its JSON columns encoded and the
    idempotency key of its create (None without one)."""

    __slots__ = ("rollout", "row_input", "row_metadata", "config_columns", "key")

    def __init__(self, rollout: Rollout, row_input: bytes, row_metadata: bytes, key: str | None = None) -> None:
        self.rollout = rollout
        self.row_input, self.row_metadata = row_input, row_metadata
        self.config_columns = config_columns(rollout.config)
        self.key = key


def _created(txn: Txn, news: list[NewRollout]) -> dict[str, Rollout]:
    """The rollouts that earlier creates with these news' keys made, by key (retried creates)."""
    keys = [new.key for new in news if new.key is not None]
    if not keys:
        return {}
    rows = txn.conn.execute(
        f"SELECT r.create_key, {ROLLOUT_COLUMNS}, {ATTEMPT_COLUMNS} FROM rollouts r {LATEST_ATTEMPT_JOIN} "
        "WHERE r.create_key IN (SELECT value FROM json_each(?))",
        (orjson.dumps(keys),),
    ).fetchall()
    return {row[0]: rollout_from_row(row[1:]) for row in rows}


def _insert_rollout(txn: Txn, new: NewRollout, status: str, queue_seq: int | None, attempt: Attempt | None) -> None:
    rollout, config = new.rollout, new.config_columns
    txn.conn.execute(
        "INSERT INTO rollouts (rollout_id, input, start_time, mode, resources_id, status, config, metadata, "
        "queue_seq, attempt_count, latest_attempt_id, timeout_seconds, unresponsive_seconds, create_key) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            new.key,
        ),
    )


def start_rollout(txn: Txn, new: NewRollout, worker_id: str | None) -> AttemptedRollout:
    created = _created(txn, [new])
    if created:
        (earlier,) = created.values()
        if not isinstance(earlier, AttemptedRollout):
            raise ConflictError(
                f"idempotency_key {new.key!r} names the enqueue of rollout {earlier.rollout_id}, which has not started"
            )
        return earlier
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
    """Enqueue in order; a news whose key an earlier create used gives that create's rollout
    instead (so does a later one in the same list with the same key)."""
    created = _created(txn, news)
    fresh = [new for new in news if new.key not in created]
    last = next_counter(txn.conn, "queue", len(fresh)) if fresh else 0
    positions = iter(range(last - len(fresh) + 1, last + 1))
    latest_id = latest_resources_id(txn.conn)
    out = []
    for new in news:
        if new.key is not None and new.key in created:
            out.append(created[new.key])
            continue
        if new.rollout.resources_id is None:
            new.rollout.resources_id = latest_id
        _insert_rollout(txn, new, "queuing", next(positions), None)
        if new.key is not None:
            created[new.key] = new.rollout
        out.append(new.rollout)
    return out


def dequeue(txn: Txn, limit: int, worker_id: str | None, metadata: dict[str, str]) -> list[AttemptedRollout]:
    """Claim the oldest `limit` queued rollouts whose metadata holds each of `metadata`'s
    key/value pairs (checked by `checks.check_metadata_match`)."""
    # Metadata is stored as JSON bytes (a BLOB), which SQLite's JSON functions read as text only.
    match = "".join(" AND json_extract(CAST(r.metadata AS TEXT), ?) IS ?" for _ in metadata)
    values = [item for key, value in metadata.items() for item in (f'$."{key}"', value)]
    rows = txn.conn.execute(
        ROLLOUT_SELECT + " WHERE r.queue_seq IS NOT NULL" + match + " ORDER BY r.queue_seq LIMIT ?", (*values, limit)
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
