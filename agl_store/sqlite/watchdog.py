"""The watchdog's scan: latest attempts past their timeout, or silent past `unresponsive_seconds`."""

from __future__ import annotations

import sqlite3

from ..base import UNSET
from ..models import AttemptedRollout, Rollout
from .attempts import AttemptChanges, change_attempt
from .schema import ATTEMPT_COLUMNS, ROLLOUT_COLUMNS, rollout_from_row
from .transactions import Txn

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


def find_unhealthy(conn: sqlite3.Connection, now: float) -> list[tuple[Rollout, str]]:
    rows = conn.execute(_UNHEALTHY_SQL, {"now": now}).fetchall()
    # Each row is a ROLLOUT_SELECT row, then the status the attempt earned.
    return [(rollout_from_row(row[:-1]), row[-1]) for row in rows]


def mark_unhealthy(txn: Txn) -> int:
    # Re-checked under the write lock: another process may have handled these already.
    marked = find_unhealthy(txn.conn, txn.now)
    for rollout, status in marked:
        assert isinstance(rollout, AttemptedRollout)
        changes = AttemptChanges(status, UNSET, UNSET)
        change_attempt(txn, rollout.attempt, rollout.status, rollout.config, rollout.attempt.attempt_id, changes)
    return len(marked)
