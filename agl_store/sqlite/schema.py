"""The SQLite schema of the store (named migrations applied in order) and its row codecs.

A database records which migrations it has in `schema_migrations` and their count in
`PRAGMA user_version`. Migrations are only ever appended: an existing database picks up
the new ones the next time any process opens it, inside one `BEGIN IMMEDIATE` so two
processes opening a fresh file at once do not both apply them.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import orjson

from .. import call_span
from ..models import Attempt, AttemptedRollout, ResourcesUpdate, Rollout, RolloutConfig, Span, Worker
from ..packed_attributes import pack_skeleton, unpack_attributes

Migration = tuple[str, Sequence[str]]

ROLLOUT_COUNT_PREFIX = "rollouts:"
"""`row_counts` holds the number of rollouts of each status under this prefix + the status."""

MIGRATIONS: tuple[Migration, ...] = (
    (
        "0001_initial",
        (
            # Rollouts carry their queue position (NULL unless queuing/requeuing) and the
            # id of their latest attempt, so the queue and "latest" need no scans.
            # timeout_seconds / unresponsive_seconds copy the config for the watchdog's SQL.
            """
            CREATE TABLE rollouts (
                rollout_id TEXT PRIMARY KEY,
                input BLOB NOT NULL,
                start_time REAL NOT NULL,
                end_time REAL,
                mode TEXT,
                resources_id TEXT,
                status TEXT NOT NULL,
                config BLOB NOT NULL,
                metadata BLOB,
                queue_seq INTEGER,
                attempt_count INTEGER NOT NULL DEFAULT 0,
                latest_attempt_id TEXT,
                timeout_seconds REAL,
                unresponsive_seconds REAL
            )
            """,
            "CREATE UNIQUE INDEX rollouts_queue ON rollouts (queue_seq) WHERE queue_seq IS NOT NULL",
            "CREATE INDEX rollouts_status ON rollouts (status)",
            "CREATE INDEX rollouts_start_time ON rollouts (start_time)",
            "CREATE INDEX rollouts_end_time ON rollouts (end_time) WHERE end_time IS NOT NULL",
            """
            CREATE TABLE attempts (
                rollout_id TEXT NOT NULL REFERENCES rollouts (rollout_id) ON DELETE CASCADE,
                attempt_id TEXT NOT NULL,
                sequence_id INTEGER NOT NULL,
                start_time REAL NOT NULL,
                end_time REAL,
                status TEXT NOT NULL,
                worker_id TEXT,
                last_heartbeat_time REAL,
                metadata BLOB,
                PRIMARY KEY (rollout_id, attempt_id),
                UNIQUE (rollout_id, sequence_id)
            )
            """,
            # Spans have no foreign key: unattributed spans (rollout_id "") have no rollout.
            # `attributes` is the JSON skeleton and `tokens` the int32 blob of agl_store.packed_attributes.
            """
            CREATE TABLE spans (
                pk INTEGER PRIMARY KEY,
                rollout_id TEXT NOT NULL,
                attempt_id TEXT NOT NULL,
                sequence_id INTEGER NOT NULL,
                trace_id TEXT NOT NULL,
                span_id TEXT NOT NULL,
                parent_id TEXT,
                name TEXT NOT NULL,
                start_time REAL,
                end_time REAL,
                status_code TEXT NOT NULL,
                attributes BLOB NOT NULL,
                tokens BLOB,
                rest BLOB NOT NULL
            )
            """,
            "CREATE UNIQUE INDEX spans_identity ON spans (rollout_id, attempt_id, span_id)",
            # The trainer's hot query: all spans of a rollout in sequence order.
            "CREATE INDEX spans_by_sequence ON spans (rollout_id, sequence_id)",
            """
            CREATE TABLE span_counters (
                rollout_id TEXT PRIMARY KEY,
                value INTEGER NOT NULL
            )
            """,
            """
            CREATE TABLE resources (
                resources_id TEXT PRIMARY KEY,
                create_time REAL NOT NULL,
                update_time REAL NOT NULL,
                version INTEGER NOT NULL,
                resources BLOB NOT NULL,
                touched INTEGER NOT NULL
            )
            """,
            # `touched` orders resource sets by their last write: the highest is the latest.
            "CREATE INDEX resources_touched ON resources (touched)",
            """
            CREATE TABLE workers (
                worker_id TEXT PRIMARY KEY,
                status TEXT NOT NULL,
                heartbeat_stats BLOB,
                last_heartbeat_time REAL,
                last_dequeue_time REAL,
                last_busy_time REAL,
                last_idle_time REAL,
                current_rollout_id TEXT,
                current_attempt_id TEXT
            )
            """,
            # Monotonic counters shared by all processes (queue positions, resource writes).
            "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        ),
    ),
    (
        "0002_watchdog_index",
        (
            # The watchdog's scan, every second: only rollouts with a timeout to watch.
            "CREATE INDEX rollouts_watched ON rollouts (status) "
            "WHERE timeout_seconds IS NOT NULL OR unresponsive_seconds IS NOT NULL",
        ),
    ),
    (
        "0003_rollout_pages_in_index_order",
        (
            # A page of rollouts filtered by status and sorted by start or end time is read in
            # the order of these indexes, one status at a time, merged: no sort of all matches.
            # (`rollouts_status` already gives the default order, by rowid, within a status.)
            "CREATE INDEX rollouts_status_start_time ON rollouts (status, start_time)",
            "CREATE INDEX rollouts_status_end_time ON rollouts (status, end_time)",
        ),
    ),
    (
        "0004_row_counts",
        (
            # Row counts kept by triggers in every write transaction, whichever process or
            # version writes: `statistics()` and page totals read them instead of counting.
            # Tables are counted under their name, rollouts per status as `rollouts:<status>`.
            "CREATE TABLE row_counts (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
            *(
                statement
                for table in ("spans", "attempts", "resources", "workers")
                for statement in (
                    f"INSERT INTO row_counts (name, value) SELECT '{table}', count(*) FROM {table}",
                    f"CREATE TRIGGER {table}_counted_insert AFTER INSERT ON {table} BEGIN "
                    f"UPDATE row_counts SET value = value + 1 WHERE name = '{table}'; END",
                    f"CREATE TRIGGER {table}_counted_delete AFTER DELETE ON {table} BEGIN "
                    f"UPDATE row_counts SET value = value - 1 WHERE name = '{table}'; END",
                )
            ),
            "INSERT INTO row_counts (name, value) SELECT 'rollouts:' || status, count(*) FROM rollouts GROUP BY status",
            "CREATE TRIGGER rollouts_counted_insert AFTER INSERT ON rollouts BEGIN "
            "INSERT INTO row_counts (name, value) VALUES ('rollouts:' || new.status, 1) "
            "ON CONFLICT (name) DO UPDATE SET value = value + 1; END",
            "CREATE TRIGGER rollouts_counted_delete AFTER DELETE ON rollouts BEGIN "
            "UPDATE row_counts SET value = value - 1 WHERE name = 'rollouts:' || old.status; END",
            "CREATE TRIGGER rollouts_counted_move AFTER UPDATE OF status ON rollouts "
            "WHEN old.status IS NOT new.status BEGIN "
            "UPDATE row_counts SET value = value - 1 WHERE name = 'rollouts:' || old.status; "
            "INSERT INTO row_counts (name, value) VALUES ('rollouts:' || new.status, 1) "
            "ON CONFLICT (name) DO UPDATE SET value = value + 1; END",
        ),
    ),
    (
        "0005_rollout_idempotency_keys",
        (
            # The idempotency key of the create that made a rollout: a retried create finds
            # its rollout here instead of making a second one.
            "ALTER TABLE rollouts ADD COLUMN create_key TEXT",
            "CREATE UNIQUE INDEX rollouts_by_create_key ON rollouts (create_key) WHERE create_key IS NOT NULL",
        ),
    ),
    (
        "0006_span_deltas",
        (
            # An LLM call stored as a delta of an earlier call of its attempt (`deltas.py`):
            # `base_pk` is that call's row, `delta` how to rebuild this one from it, `stamp` a
            # value unique to each call row, so the writer's in-memory index can be checked
            # against the row. Rows written before have NULLs: whole, and never parents.
            "ALTER TABLE spans ADD COLUMN base_pk INTEGER",
            "ALTER TABLE spans ADD COLUMN delta BLOB",
            "ALTER TABLE spans ADD COLUMN stamp BLOB",
        ),
    ),
)
"""Every schema change, oldest first. Append only; never edit a released one."""


def configure_connection(conn: sqlite3.Connection, *, busy_timeout_ms: int, in_memory: bool) -> None:
    """Per-connection settings: WAL with NORMAL sync (a committed write survives a killed
    process), a busy timeout so concurrent writers queue instead of failing, foreign keys,
    and disk space that deleting rollouts gives back."""
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    if not in_memory:
        # Takes effect only on a file without tables yet: then `PRAGMA incremental_vacuum`
        # after deletes returns freed pages to the file system.
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("PRAGMA journal_mode = WAL")
        # After a checkpoint the WAL file shrinks back to this size instead of keeping its peak.
        conn.execute(f"PRAGMA journal_size_limit = {64 * 1024 * 1024}")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA temp_store = MEMORY")


def configure_reader(conn: sqlite3.Connection, *, busy_timeout_ms: int) -> None:
    """Settings of a connection that only reads a WAL file (`configure_connection` set it up)."""
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA query_only = ON")
    conn.execute("PRAGMA temp_store = MEMORY")


def apply_migrations(conn: sqlite3.Connection, migrations: Sequence[Migration] = MIGRATIONS) -> list[str]:
    """Apply the migrations this database lacks, in order, in one transaction.

    Returns the names applied now. The connection must be in autocommit mode
    (`isolation_level=None`) so the explicit BEGIN here is the only transaction.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
        done = {row[0] for row in conn.execute("SELECT name FROM schema_migrations")}
        applied: list[str] = []
        for name, statements in migrations:
            if name in done:
                continue
            for statement in statements:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)", (name, time.time()))
            applied.append(name)
        conn.execute(f"PRAGMA user_version = {len(done) + len(applied)}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return applied


# --- rows <-> models ----------------------------------------------------------------------
# Column lists and decoders live beside the tables they read, so a schema change touches
# one file. Decoders take plain tuples (the sqlite3 default row type).

ROLLOUT_COLUMNS = (
    "r.rollout_id, r.input, r.start_time, r.end_time, r.mode, r.resources_id, r.status, r.config, r.metadata"
)
ATTEMPT_COLUMNS = (
    "a.rollout_id, a.attempt_id, a.sequence_id, a.start_time, a.end_time, a.status, a.worker_id, "
    "a.last_heartbeat_time, a.metadata"
)
LATEST_ATTEMPT_JOIN = "LEFT JOIN attempts a ON a.rollout_id = r.rollout_id AND a.attempt_id = r.latest_attempt_id"
ROLLOUT_SELECT = f"SELECT {ROLLOUT_COLUMNS}, {ATTEMPT_COLUMNS} FROM rollouts r {LATEST_ATTEMPT_JOIN}"
"""A rollout with its latest attempt (NULL columns when it has none)."""

SPAN_COLUMNS = (
    "rollout_id, attempt_id, sequence_id, trace_id, span_id, parent_id, name, start_time, end_time, "
    "status_code, attributes, tokens, rest"
)
STORED_SPAN_COLUMNS = SPAN_COLUMNS + ", pk, base_pk, delta"
"""What span reads select: `SPAN_COLUMNS`, then what `delta_reads.materialise` needs."""
WORKER_COLUMNS = (
    "worker_id, status, heartbeat_stats, last_heartbeat_time, last_dequeue_time, last_busy_time, "
    "last_idle_time, current_rollout_id, current_attempt_id"
)
RESOURCES_COLUMNS = "resources_id, create_time, update_time, version, resources"

_SPAN_COLUMN_FIELDS = ("trace_id", "span_id", "parent_id", "name", "start_time", "end_time")
SPAN_REST_EXCLUDE = frozenset({"rollout_id", "attempt_id", "sequence_id", "attributes", *_SPAN_COLUMN_FIELDS})
"""Span fields kept in their own columns; everything else goes to the `rest` JSON."""


def _loads(value: bytes | str | None) -> Any:
    return None if value is None else orjson.loads(value)


def config_columns(config: RolloutConfig) -> dict[str, Any]:
    """The rollouts columns a config fills: its JSON, and the two timeouts the watchdog's SQL reads."""
    return {
        "config": orjson.dumps(config.model_dump()),
        "timeout_seconds": config.timeout_seconds,
        "unresponsive_seconds": config.unresponsive_seconds,
    }


def config_from_column(value: bytes | str) -> RolloutConfig:
    return RolloutConfig.model_validate(orjson.loads(value))


def attempt_from_row(row: Sequence[Any]) -> Attempt:
    return Attempt(
        rollout_id=row[0],
        attempt_id=row[1],
        sequence_id=row[2],
        start_time=row[3],
        end_time=row[4],
        status=row[5],
        worker_id=row[6],
        last_heartbeat_time=row[7],
        metadata=_loads(row[8]),
    )


def rollout_from_row(row: Sequence[Any]) -> Rollout:
    """Decode a `ROLLOUT_SELECT` row: an `AttemptedRollout` when it has an attempt."""
    fields = dict(
        rollout_id=row[0],
        input=_loads(row[1]),
        start_time=row[2],
        end_time=row[3],
        mode=row[4],
        resources_id=row[5],
        status=row[6],
        config=config_from_column(row[7]),
        metadata=_loads(row[8]),
    )
    if len(row) > 9 and row[9] is not None:
        return AttemptedRollout(**fields, attempt=attempt_from_row(row[9:18]))
    return Rollout(**fields)


def span_from_row(row: Sequence[Any]) -> Span:
    fields = orjson.loads(row[12])
    fields.update(
        rollout_id=row[0],
        attempt_id=row[1],
        sequence_id=row[2],
        trace_id=row[3],
        span_id=row[4],
        parent_id=row[5],
        name=row[6],
        start_time=row[7],
        end_time=row[8],
        attributes=unpack_attributes(row[10], row[11]),
    )
    return Span.model_validate(fields)


def span_to_row(span: Span, sequence_id: int | None, packed: bytes | None = None) -> tuple[Any, ...]:
    """The `SPAN_COLUMNS` values of a span. Raises TypeError for attributes that are not JSON.

    `packed` is a token blob the client already made (`packed_attributes.pack_attributes`, checked by
    `packed_attributes.check_packed`): the span's attributes are then its skeleton and stored as is.
    """
    return encode_span_row(span, sequence_id, packed)[0]


def encode_span_row(
    span: Span, sequence_id: int | None, packed: bytes | None = None
) -> tuple[tuple[Any, ...], dict[str, Any], bytes | None]:
    """`span_to_row`, the attributes skeleton whose JSON its `attributes` column is, and the
    JSON of the request's messages inside it (or None): the delta writer reads and rewrites
    the skeleton and compares calls by their messages' JSON, made here once."""
    if packed is None:
        skeleton, tokens = pack_skeleton(span.attributes)
    else:
        skeleton, tokens = span.attributes, packed
    attributes, messages_json = _dumps_with_messages(skeleton)
    rest = span.model_dump(exclude=SPAN_REST_EXCLUDE)  # type: ignore[arg-type]
    row = (
        span.rollout_id,
        span.attempt_id,
        sequence_id,
        span.trace_id,
        span.span_id,
        span.parent_id,
        span.name,
        span.start_time,
        span.end_time,
        span.status.status_code,
        attributes,
        tokens,
        orjson.dumps(rest),
    )
    return row, skeleton, messages_json


def _dumps_with_messages(skeleton: dict[str, Any]) -> tuple[bytes, bytes | None]:
    """`orjson.dumps(skeleton)`, and the JSON of `agl.request`'s messages list in it: dumped
    first and placed in the text as it is (an `orjson.Fragment`), so the same bytes."""
    request = skeleton.get(call_span.REQUEST)
    if type(request) is not dict or type(request.get("messages")) is not list:
        return orjson.dumps(skeleton), None
    messages = request["messages"]
    messages_json = orjson.dumps(messages)
    fragment = {**request, "messages": orjson.Fragment(messages_json)}
    return orjson.dumps({**skeleton, call_span.REQUEST: fragment}), messages_json


def worker_from_row(row: Sequence[Any]) -> Worker:
    return Worker(
        worker_id=row[0],
        status=row[1],
        heartbeat_stats=_loads(row[2]),
        last_heartbeat_time=row[3],
        last_dequeue_time=row[4],
        last_busy_time=row[5],
        last_idle_time=row[6],
        current_rollout_id=row[7],
        current_attempt_id=row[8],
    )


def resources_from_row(row: Sequence[Any]) -> ResourcesUpdate:
    return ResourcesUpdate(
        resources_id=row[0],
        create_time=row[1],
        update_time=row[2],
        version=row[3],
        resources=orjson.loads(row[4]),
    )
