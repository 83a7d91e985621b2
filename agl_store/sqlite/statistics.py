"""Store statistics: row counts kept by triggers (no table is counted) and free space."""

from __future__ import annotations

import sqlite3
from typing import Any

from .schema import ROLLOUT_COUNT_PREFIX


def read_statistics(conn: sqlite3.Connection) -> dict[str, Any]:
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
