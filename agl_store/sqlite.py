"""SQLiteStore: the embedded LightningStore, on a SQLite file or in memory (`:memory:`).

One aiosqlite connection per store. Each operation is one plain function over the
`sqlite3.Connection`, run whole on aiosqlite's connection thread: one thread hop per call
instead of one per statement, and since that thread runs one function at a time, the
store's writes are serialised. Every write runs inside `atomic()` (`BEGIN IMMEDIATE`), which
also serialises writers across processes sharing the file, so sequence numbers and
dequeues stay unique without any lock of our own.

A background task started by `open()` marks timed-out and unresponsive attempts; it is a
conditional write, so several processes running it at once is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, Sequence, Tuple, TypeVar

import aiosqlite
import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from .base import UNSET, FilterLogic, LightningStore, SortOrder
from .errors import ConflictError, InvalidInputError, NotFoundError, StoreClosedError, StoreError
from .models import (
    QUEUED_ROLLOUT_STATUSES,
    TERMINAL_ROLLOUT_STATUSES,
    WORKER_STATUSES,
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    EnqueueRolloutRequest,
    NamedResources,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Span,
    SpanContext,
    StoreStatistics,
    TaskInput,
    TraceStatus,
    Worker,
    WorkerStatus,
    new_id,
)
from .sqlite_schema import (
    ATTEMPT_COLUMNS,
    RESOURCES_COLUMNS,
    ROLLOUT_COLUMNS,
    ROLLOUT_SELECT,
    SPAN_COLUMNS,
    WORKER_COLUMNS,
    apply_migrations,
    attempt_from_row,
    configure_connection,
    resources_from_row,
    rollout_from_row,
    span_from_row,
    span_to_row,
    worker_from_row,
)
from .transitions import (
    ATTEMPT_END_STATUSES,
    check_attempt_move,
    check_attempt_status,
    check_rollout_move,
    check_rollout_status,
    rollout_status_from_attempt,
    worker_status_for_attempt,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

UNATTRIBUTED_ROLLOUT_ID = ""
"""Spans of calls made without rollout ids: stored without a rollout or attempt row."""

ROLLOUT_MODES = ("train", "val", "test")
ROLLOUT_SORT_FIELDS = frozenset({"rollout_id", "start_time", "end_time", "status", "mode", "resources_id"})
ATTEMPT_SORT_FIELDS = frozenset(
    {"sequence_id", "attempt_id", "start_time", "end_time", "status", "worker_id", "last_heartbeat_time"}
)
SPAN_SORT_FIELDS = frozenset(
    {"sequence_id", "start_time", "end_time", "name", "trace_id", "span_id", "parent_id", "attempt_id"}
)
RESOURCES_SORT_FIELDS = frozenset({"resources_id", "create_time", "update_time", "version"})
WORKER_SORT_FIELDS = frozenset(
    {
        "worker_id",
        "status",
        "last_heartbeat_time",
        "last_dequeue_time",
        "last_busy_time",
        "last_idle_time",
        "current_rollout_id",
    }
)

_RESOURCES = TypeAdapter(NamedResources)
_TERMINAL_SQL = "('succeeded', 'failed', 'cancelled')"


class Page(List[T]):
    """One page of a query: a plain list plus `total`, the match count before paging."""

    def __init__(self, items: Sequence[T] = (), total: int | None = None) -> None:
        super().__init__(items)
        self.total = len(self) if total is None else total


@contextlib.contextmanager
def atomic(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: `BEGIN IMMEDIATE` takes the write lock up front (waiting up to
    the busy timeout for other processes), so a transaction never fails half-way on a lock."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class _Txn:
    """What a write function needs: the connection, one clock reading, and the rollouts it
    finished (the store wakes `wait_for_rollouts` for them after the commit)."""

    __slots__ = ("conn", "now", "finished")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.now = time.time()
        self.finished: List[str] = []


class SQLiteStore(LightningStore):
    """A LightningStore on one SQLite database: a file path, or `":memory:"`.

    Args:
        path: the database file (created with its parent folders) or `":memory:"`.
        watchdog_interval: seconds between the background scans for timed-out and
            unresponsive attempts.
        poll_interval: how often `wait_for_rollouts` re-reads the database to notice other
            processes' writes (this process's own writes wake it at once).
        busy_timeout: seconds a write waits for another process's transaction to end.
    """

    name = "SQLiteStore"

    def __init__(
        self,
        path: str | os.PathLike[str] = ":memory:",
        *,
        watchdog_interval: float = 1.0,
        poll_interval: float = 0.5,
        busy_timeout: float = 30.0,
    ) -> None:
        if watchdog_interval <= 0:
            raise InvalidInputError(f"watchdog_interval must be > 0, got {watchdog_interval}")
        if poll_interval <= 0:
            raise InvalidInputError(f"poll_interval must be > 0, got {poll_interval}")
        self.path = str(path)
        self.in_memory = self.path == ":memory:"
        self.watchdog_interval = watchdog_interval
        self.poll_interval = poll_interval
        self.busy_timeout = busy_timeout
        self._db: aiosqlite.Connection | None = None
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._watchdog: asyncio.Task[None] | None = None
        self._finished_event: asyncio.Event | None = None
        self._opened_at = time.time()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._db is not None else "new"
        return f"SQLiteStore({self.path!r}, {state})"

    # --- lifecycle -----------------------------------------------------------------------

    async def open(self) -> "SQLiteStore":
        """Connect, apply pending migrations and start the watchdog. Idempotent."""
        if self._closed:
            raise StoreClosedError("this SQLiteStore was closed; create a new one")
        if self._db is not None:
            return self
        if not self.in_memory:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: every transaction is an explicit `atomic()`.
        db = await aiosqlite.connect(self.path, isolation_level=None, cached_statements=256)
        try:
            conn = db._conn  # used only on db's own thread, through db._execute
            await db._execute(
                configure_connection, conn, busy_timeout_ms=int(self.busy_timeout * 1000), in_memory=self.in_memory
            )
            await db._execute(apply_migrations, conn)
        except BaseException:
            await db.close()
            raise
        self._db, self._conn = db, conn
        self._finished_event = asyncio.Event()
        self._opened_at = time.time()
        self._watchdog = asyncio.create_task(self._run_watchdog(), name=f"agl-store-watchdog:{self.path}")
        return self

    async def __aenter__(self) -> "SQLiteStore":
        return await self.open()

    async def close(self) -> None:
        """Stop the watchdog and close the database. Later calls raise StoreClosedError."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        self._wake_waiters()
        if self._db is not None:
            await self._db.close()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)` on the connection thread."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        if self._db is None:
            raise StoreClosedError("the store is not open; call `await store.open()` first")
        try:
            return await self._db._execute(fn, self._conn, *args)
        except ValueError as exc:
            if self._closed or str(exc) == "Connection closed":
                raise StoreClosedError("the store is closed") from exc
            raise
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite error: {exc}") from exc

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(txn, *args)` as one transaction, then wake waiters of what it finished."""

        def run(conn: sqlite3.Connection) -> Tuple[T, List[str]]:
            txn = _Txn(conn)
            with atomic(conn):
                result = fn(txn, *args)
            return result, txn.finished

        result, finished = await self._call(run)
        if finished:
            self._wake_waiters()
        return result

    def _wake_waiters(self) -> None:
        # Broadcast: waiters hold the current event; a fresh one serves the next round.
        if self._finished_event is not None:
            self._finished_event.set()
            self._finished_event = asyncio.Event()

    async def _run_watchdog(self) -> None:
        while True:
            await asyncio.sleep(self.watchdog_interval)
            try:
                await self.scan_unhealthy_attempts()
            except StoreClosedError:
                return
            except Exception:  # the watchdog must outlive a bad scan (e.g. a locked file)
                logger.exception("store watchdog scan failed")

    async def scan_unhealthy_attempts(self) -> int:
        """Mark latest attempts past their timeout `timeout` and silent ones `unresponsive`,
        propagating to their rollouts; returns how many attempts changed. The background
        task calls this every `watchdog_interval` seconds."""
        candidates = await self._call(_find_unhealthy, time.time())
        if not candidates:  # the common case takes no write lock
            return 0
        return await self._write(_mark_unhealthy)

    async def statistics(self) -> StoreStatistics:
        stats = await self._call(_statistics)
        database_bytes = None
        if not self.in_memory:
            database_bytes = stats.pop("page_bytes")
            wal = Path(self.path + "-wal")
            if wal.exists():
                database_bytes += wal.stat().st_size
        else:
            stats.pop("page_bytes")
        return StoreStatistics(
            name=self.name, uptime=time.time() - self._opened_at, database_bytes=database_bytes, **stats
        )

    # --- rollouts and the queue -----------------------------------------------------------

    async def start_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: Dict[str, Any] | None = None,
        worker_id: str | None = None,
    ) -> AttemptedRollout:
        new = _new_rollout(input, mode, resources_id, config, metadata)
        return await self._write(_start_rollout, new, worker_id)

    async def enqueue_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: Dict[str, Any] | None = None,
    ) -> Rollout:
        new = _new_rollout(input, mode, resources_id, config, metadata)
        return (await self._write(_enqueue_rollouts, [new]))[0]

    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> Sequence[Rollout]:
        news = []
        for index, request in enumerate(rollouts):
            if isinstance(request, dict):
                request = _validate(EnqueueRolloutRequest, request, f"rollouts[{index}]")
            news.append(_new_rollout(request.input, request.mode, request.resources_id, request.config, request.metadata))
        if not news:
            return []
        return await self._write(_enqueue_rollouts, news)

    async def dequeue_rollout(self, worker_id: Optional[str] = None) -> Optional[AttemptedRollout]:
        claimed = await self._write(_dequeue, 1, worker_id)
        return claimed[0] if claimed else None

    async def dequeue_many_rollouts(
        self, *, limit: int = 1, worker_id: Optional[str] = None
    ) -> Sequence[AttemptedRollout]:
        if not isinstance(limit, int) or limit < 0:
            raise InvalidInputError(f"limit must be an int >= 0, got {limit!r}")
        if limit == 0:
            return []
        return await self._write(_dequeue, limit, worker_id)

    async def start_attempt(self, rollout_id: str, worker_id: Optional[str] = None) -> AttemptedRollout:
        return await self._write(_start_attempt, rollout_id, worker_id)

    async def update_rollout(
        self,
        rollout_id: str,
        input: TaskInput = UNSET,
        mode: Optional[RolloutMode] = UNSET,
        resources_id: Optional[str] = UNSET,
        status: RolloutStatus = UNSET,
        config: RolloutConfig = UNSET,
        metadata: Optional[Dict[str, Any]] = UNSET,
    ) -> Rollout:
        columns: Dict[str, Any] = {}
        if input is not UNSET:
            columns["input"] = _dumps(input, "input")
        if mode is not UNSET:
            columns["mode"] = _check_mode(mode)
        if resources_id is not UNSET:
            columns["resources_id"] = resources_id
        if config is not UNSET:
            checked = _check_config(config)
            columns["config"] = orjson.dumps(checked.model_dump())
            columns["timeout_seconds"] = checked.timeout_seconds
            columns["unresponsive_seconds"] = checked.unresponsive_seconds
        if metadata is not UNSET:
            columns["metadata"] = _dumps(_check_metadata(metadata), "metadata")
        if status is not UNSET:
            check_rollout_status(status)
        return await self._write(_update_rollout, rollout_id, columns, status)

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"],
        status: AttemptStatus = UNSET,
        worker_id: str = UNSET,
        last_heartbeat_time: float = UNSET,
        metadata: Optional[Dict[str, Any]] = UNSET,
    ) -> Attempt:
        if status is not UNSET:
            check_attempt_status(status)
        if last_heartbeat_time is not UNSET and not isinstance(last_heartbeat_time, (int, float)):
            raise InvalidInputError(f"last_heartbeat_time must be a number, got {last_heartbeat_time!r}")
        if metadata is not UNSET:
            _check_metadata(metadata)
        changes = _AttemptChanges(status, worker_id, last_heartbeat_time, metadata)
        return await self._write(_update_attempt, rollout_id, attempt_id, changes)

    async def get_rollout_by_id(self, rollout_id: str) -> Optional[Rollout]:
        return await self._call(_get_rollout, rollout_id)

    async def get_latest_attempt(self, rollout_id: str) -> Optional[Attempt]:
        return await self._call(_get_latest_attempt, rollout_id)

    async def query_rollouts(
        self,
        *,
        status_in: Optional[Sequence[RolloutStatus]] = None,
        rollout_id_in: Optional[Sequence[str]] = None,
        rollout_id_contains: Optional[str] = None,
        mode: Optional[RolloutMode] = None,
        start_time_after: Optional[float] = None,
        start_time_before: Optional[float] = None,
        filter_logic: FilterLogic = "and",
        sort_by: Optional[str] = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Sequence[Rollout]:
        where = _Where()
        if status_in is not None:
            statuses = [check_rollout_status(s, "status_in") for s in _as_list(status_in, "status_in")]
            where.add("r.status IN (SELECT value FROM json_each(?))", orjson.dumps(statuses))
        if rollout_id_in is not None:
            where.add("r.rollout_id IN (SELECT value FROM json_each(?))", orjson.dumps(_as_list(rollout_id_in, "rollout_id_in")))
        if rollout_id_contains is not None:
            where.add("instr(r.rollout_id, ?) > 0", rollout_id_contains)
        if mode is not None:
            where.add("r.mode = ?", _check_mode(mode))
        if start_time_after is not None:
            where.add("r.start_time > ?", _check_number(start_time_after, "start_time_after"))
        if start_time_before is not None:
            where.add("r.start_time < ?", _check_number(start_time_before, "start_time_before"))
        query = _PagedQuery(
            select=ROLLOUT_SELECT,
            count="SELECT count(*) FROM rollouts r",
            where=where.sql(_check_logic(filter_logic)),
            params=where.params,
            order=_order_by("r", sort_by, ROLLOUT_SORT_FIELDS, sort_order, default="r.rowid"),
            limit=limit,
            offset=offset,
        )
        return await self._call(_run_paged, query, rollout_from_row)

    async def query_attempts(
        self,
        rollout_id: str,
        *,
        sort_by: Optional[str] = "sequence_id",
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Sequence[Attempt]:
        query = _PagedQuery(
            select=f"SELECT {ATTEMPT_COLUMNS} FROM attempts a",
            count="SELECT count(*) FROM attempts a",
            where=" WHERE a.rollout_id = ?",
            params=[rollout_id],
            order=_order_by("a", sort_by, ATTEMPT_SORT_FIELDS, sort_order, default="a.sequence_id"),
            limit=limit,
            offset=offset,
        )
        return await self._call(_run_paged, query, attempt_from_row)

    async def wait_for_rollouts(self, *, rollout_ids: List[str], timeout: Optional[float] = None) -> List[Rollout]:
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise InvalidInputError(f"timeout must be None or a number >= 0, got {timeout!r}")
        ids = list(dict.fromkeys(_as_list(rollout_ids, "rollout_ids")))
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            # Take the event before reading, so a finish between the read and the wait
            # still wakes us.
            event = self._finished_event
            statuses = await self._call(_rollout_statuses, ids)
            finished = [rid for rid in ids if statuses[rid] in TERMINAL_ROLLOUT_STATUSES]
            remaining = None if deadline is None else deadline - loop.time()
            if len(finished) == len(ids) or (remaining is not None and remaining <= 0):
                rollouts = await self._call(_get_rollouts, finished)
                # A finished rollout stays finished, but it may have been deleted meanwhile.
                return [rollouts[rid] for rid in finished if rid in rollouts]
            wait = self.poll_interval if remaining is None else min(self.poll_interval, remaining)
            if event is None:
                raise StoreClosedError("the store is not open")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), wait)

    # --- spans ---------------------------------------------------------------------------

    async def add_span(self, span: Span) -> Optional[Span]:
        stored = await self._write(_add_spans, [_encode_span(span, 0)])
        return stored[0] if stored else None

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        encoded = [_encode_span(span, index) for index, span in enumerate(spans)]
        if not encoded:
            return []
        return await self._write(_add_spans, encoded)

    async def add_otel_span(
        self,
        rollout_id: str,
        attempt_id: str,
        readable_span: Any,
        sequence_id: int | None = None,
    ) -> Optional[Span]:
        return await self.add_span(span_from_otel(readable_span, rollout_id, attempt_id, sequence_id))

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        return (await self._write(_issue_sequence_ids, [(rollout_id, attempt_id)]))[0]

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[Tuple[str, str]]) -> Sequence[int]:
        pairs = [(str(rollout_id), str(attempt_id)) for rollout_id, attempt_id in rollout_attempt_ids]
        if not pairs:
            return []
        return await self._write(_issue_sequence_ids, pairs)

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        trace_id: Optional[str] = None,
        trace_id_contains: Optional[str] = None,
        span_id: Optional[str] = None,
        span_id_contains: Optional[str] = None,
        parent_id: Optional[str] = None,
        parent_id_contains: Optional[str] = None,
        name: Optional[str] = None,
        name_contains: Optional[str] = None,
        filter_logic: FilterLogic = "and",
        limit: int = -1,
        offset: int = 0,
        sort_by: Optional[str] = "sequence_id",
        sort_order: SortOrder = "asc",
    ) -> Sequence[Span]:
        where = _Where()
        for column, exact, contains in (
            ("trace_id", trace_id, trace_id_contains),
            ("span_id", span_id, span_id_contains),
            ("parent_id", parent_id, parent_id_contains),
            ("name", name, name_contains),
        ):
            if exact is not None:
                where.add(f"{column} = ?", exact)
            if contains is not None:
                where.add(f"instr({column}, ?) > 0", contains)
        optional = where.sql(_check_logic(filter_logic))
        must = " WHERE rollout_id = ?" + (" AND attempt_id = ?" if attempt_id is not None else "")
        query = _PagedQuery(
            select=f"SELECT {SPAN_COLUMNS} FROM spans",
            count="SELECT count(*) FROM spans",
            where=must + (" AND (" + optional[len(" WHERE ") :] + ")" if optional else ""),
            params=[rollout_id, *([attempt_id] if attempt_id is not None else []), *where.params],
            order=_order_by(None, sort_by, SPAN_SORT_FIELDS, sort_order, default="pk"),
            limit=limit,
            offset=offset,
        )
        return await self._call(_query_spans, query, attempt_id == "latest")

    # --- resources -------------------------------------------------------------------------

    async def add_resources(self, resources: NamedResources) -> ResourcesUpdate:
        return await self._write(_put_resources, new_id("rs"), _encode_resources(resources), False)

    async def update_resources(self, resources_id: str, resources: NamedResources) -> ResourcesUpdate:
        if not isinstance(resources_id, str) or not resources_id:
            raise InvalidInputError(f"resources_id must be a non-empty string, got {resources_id!r}")
        return await self._write(_put_resources, resources_id, _encode_resources(resources), True)

    async def get_resources_by_id(self, resources_id: str) -> Optional[ResourcesUpdate]:
        return await self._call(_get_resources, resources_id)

    async def get_latest_resources(self) -> Optional[ResourcesUpdate]:
        return await self._call(_get_resources, None)

    async def query_resources(
        self,
        *,
        resources_id: Optional[str] = None,
        resources_id_contains: Optional[str] = None,
        sort_by: Optional[str] = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Sequence[ResourcesUpdate]:
        where = _Where()
        if resources_id is not None:
            where.add("resources_id = ?", resources_id)
        if resources_id_contains is not None:
            where.add("instr(resources_id, ?) > 0", resources_id_contains)
        query = _PagedQuery(
            select=f"SELECT {RESOURCES_COLUMNS} FROM resources",
            count="SELECT count(*) FROM resources",
            where=where.sql("and"),
            params=where.params,
            order=_order_by(None, sort_by, RESOURCES_SORT_FIELDS, sort_order, default="rowid"),
            limit=limit,
            offset=offset,
        )
        return await self._call(_run_paged, query, resources_from_row)

    # --- workers ---------------------------------------------------------------------------

    async def update_worker(self, worker_id: str, heartbeat_stats: Dict[str, Any] = UNSET) -> Worker:
        if not isinstance(worker_id, str) or not worker_id:
            raise InvalidInputError(f"worker_id must be a non-empty string, got {worker_id!r}")
        stats = UNSET if heartbeat_stats is UNSET else _dumps(_check_metadata(heartbeat_stats, "heartbeat_stats"), "heartbeat_stats")
        return await self._write(_heartbeat_worker, worker_id, stats)

    async def query_workers(
        self,
        *,
        status_in: Optional[Sequence[WorkerStatus]] = None,
        worker_id_contains: Optional[str] = None,
        filter_logic: FilterLogic = "and",
        sort_by: Optional[str] = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Sequence[Worker]:
        where = _Where()
        if status_in is not None:
            statuses = _as_list(status_in, "status_in")
            for status in statuses:
                if status not in WORKER_STATUSES:
                    raise InvalidInputError(f"status_in: unknown worker status {status!r}; expected one of {list(WORKER_STATUSES)}")
            where.add("status IN (SELECT value FROM json_each(?))", orjson.dumps(statuses))
        if worker_id_contains is not None:
            where.add("instr(worker_id, ?) > 0", worker_id_contains)
        query = _PagedQuery(
            select=f"SELECT {WORKER_COLUMNS} FROM workers",
            count="SELECT count(*) FROM workers",
            where=where.sql(_check_logic(filter_logic)),
            params=where.params,
            order=_order_by(None, sort_by, WORKER_SORT_FIELDS, sort_order, default="rowid"),
            limit=limit,
            offset=offset,
        )
        return await self._call(_run_paged, query, worker_from_row)

    async def get_worker_by_id(self, worker_id: str) -> Optional[Worker]:
        return await self._call(_get_worker, worker_id)

    # --- retention -------------------------------------------------------------------------

    async def delete_rollouts(self, rollout_ids: Sequence[str]) -> int:
        ids = list(dict.fromkeys(_as_list(rollout_ids, "rollout_ids")))
        if not ids:
            return 0
        return await self._write(_delete_rollouts, ids)

    async def expire_rollouts(self, older_than_seconds: float) -> int:
        _check_number(older_than_seconds, "older_than_seconds")
        if older_than_seconds < 0:
            raise InvalidInputError(f"older_than_seconds must be >= 0, got {older_than_seconds}")
        return await self._write(_expire_rollouts, older_than_seconds)


# === validation (event loop side, before any transaction) ===================================


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(value: Any, field: str) -> bytes:
    try:
        return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:
        raise InvalidInputError(f"{field} is not JSON: {exc}") from exc


def _validate(model: type[T], value: Any, field: str) -> T:
    try:
        return model.model_validate(value)  # type: ignore[attr-defined]
    except ValidationError as exc:
        raise InvalidInputError(f"{field}: {exc.errors()[0]['msg']} ({exc.error_count()} error(s))") from exc


def _check_mode(mode: Any) -> Optional[str]:
    if mode is not None and mode not in ROLLOUT_MODES:
        raise InvalidInputError(f"mode: unknown rollout mode {mode!r}; expected one of {list(ROLLOUT_MODES)} or None")
    return mode


def _check_config(config: Any) -> RolloutConfig:
    if isinstance(config, RolloutConfig):
        return config
    return _validate(RolloutConfig, config, "config")


def _check_metadata(metadata: Any, field: str = "metadata") -> Any:
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInputError(f"{field} must be an object or null, got {type(metadata).__name__}")
    return metadata


def _check_number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(f"{field} must be a number, got {value!r}")
    return float(value)


def _check_logic(filter_logic: Any) -> str:
    if filter_logic not in ("and", "or"):
        raise InvalidInputError(f"filter_logic must be 'and' or 'or', got {filter_logic!r}")
    return filter_logic


def _as_list(values: Any, field: str) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, set, frozenset)):
        raise InvalidInputError(f"{field} must be a list, got {type(values).__name__}")
    return list(values)


def _order_by(
    table: Optional[str], sort_by: Optional[str], allowed: frozenset[str], sort_order: Any, *, default: str
) -> str:
    if sort_order not in ("asc", "desc"):
        raise InvalidInputError(f"sort_order must be 'asc' or 'desc', got {sort_order!r}")
    direction = sort_order.upper()
    if sort_by is None:
        return f" ORDER BY {default} {direction}"
    if sort_by not in allowed:
        raise InvalidInputError(f"sort_by: cannot sort by {sort_by!r}; expected one of {sorted(allowed)}")
    prefix = f"{table}." if table else ""
    # The default order breaks ties, so pages are stable.
    return f" ORDER BY {prefix}{sort_by} {direction}, {default} {direction}"


def _check_paging(limit: Any, offset: Any) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < -1:
        raise InvalidInputError(f"limit must be -1 (no limit) or an int >= 0, got {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidInputError(f"offset must be an int >= 0, got {offset!r}")


class _Where:
    """Filter clauses and their parameters, joined by the query's filter_logic."""

    def __init__(self) -> None:
        self.clauses: List[str] = []
        self.params: List[Any] = []

    def add(self, clause: str, param: Any) -> None:
        self.clauses.append(clause)
        self.params.append(param)

    def sql(self, logic: str) -> str:
        if not self.clauses:
            return ""
        return " WHERE " + f" {logic.upper()} ".join(f"({clause})" for clause in self.clauses)


class _PagedQuery:
    __slots__ = ("select", "count", "where", "params", "order", "limit", "offset")

    def __init__(
        self, *, select: str, count: str, where: str, params: List[Any], order: str, limit: Any, offset: Any
    ) -> None:
        _check_paging(limit, offset)
        self.select, self.count, self.where, self.params = select, count, where, params
        self.order, self.limit, self.offset = order, limit, offset


class _NewRollout:
    """A validated, encoded rollout about to be inserted."""

    __slots__ = ("rollout", "row_input", "row_config", "row_metadata")

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout
        self.row_input = _dumps(rollout.input, "input")
        self.row_config = orjson.dumps(rollout.config.model_dump())
        self.row_metadata = _dumps(rollout.metadata, "metadata")


def _new_rollout(
    input: Any, mode: Any, resources_id: Optional[str], config: Any, metadata: Any
) -> _NewRollout:
    rollout = Rollout.model_construct(
        rollout_id=new_id("ro"),
        input=input,
        start_time=time.time(),
        end_time=None,
        mode=_check_mode(mode),
        resources_id=resources_id,
        status="queuing",
        config=RolloutConfig() if config is None else _check_config(config).model_copy(deep=True),
        metadata=dict(_check_metadata(metadata) or {}),
    )
    return _NewRollout(rollout)


class _EncodedSpan:
    __slots__ = ("span", "row")

    def __init__(self, span: Span, row: tuple) -> None:
        self.span = span
        self.row = row


def _encode_span(span: Any, index: int) -> _EncodedSpan:
    if not isinstance(span, Span):
        span = _validate(Span, span, f"spans[{index}]")
    if span.sequence_id is not None and (isinstance(span.sequence_id, bool) or span.sequence_id < 1):
        raise InvalidInputError(f"spans[{index}].sequence_id must be >= 1, got {span.sequence_id!r}")
    try:
        return _EncodedSpan(span, span_to_row(span, span.sequence_id))
    except TypeError as exc:
        raise InvalidInputError(f"spans[{index}] is not JSON: {exc}") from exc


def _encode_resources(resources: Any) -> Tuple[NamedResources, bytes]:
    try:
        validated = _RESOURCES.validate_python(resources)
    except ValidationError as exc:
        raise InvalidInputError(f"resources: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}") from exc
    return validated, _RESOURCES.dump_json(validated)


class _AttemptChanges:
    __slots__ = ("status", "worker_id", "last_heartbeat_time", "metadata")

    def __init__(self, status: Any, worker_id: Any, last_heartbeat_time: Any, metadata: Any) -> None:
        self.status, self.worker_id = status, worker_id
        self.last_heartbeat_time, self.metadata = last_heartbeat_time, metadata


def span_from_otel(readable_span: Any, rollout_id: str, attempt_id: str, sequence_id: int | None) -> Span:
    """Convert an `opentelemetry.sdk.trace.ReadableSpan` into a Span of the attempt."""
    from opentelemetry import trace as trace_api

    def context(ctx: Any) -> Optional[SpanContext]:
        if ctx is None:
            return None
        return SpanContext(
            trace_id=trace_api.format_trace_id(ctx.trace_id),
            span_id=trace_api.format_span_id(ctx.span_id),
            is_remote=bool(ctx.is_remote),
            trace_state=dict(ctx.trace_state.items()) if ctx.trace_state else {},
        )

    def seconds(ns: Optional[int]) -> Optional[float]:
        return None if ns is None else ns / 1e9

    def plain(attributes: Any) -> Dict[str, Any]:
        # OpenTelemetry keeps sequences as tuples; the span schema wants JSON arrays.
        return {k: list(v) if isinstance(v, tuple) else v for k, v in (attributes or {}).items()}

    own = context(readable_span.get_span_context())
    parent = context(readable_span.parent)
    ids: Dict[str, Any] = {"trace_id": own.trace_id, "span_id": own.span_id} if own else {}
    resource = readable_span.resource
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        **ids,
        parent_id=parent.span_id if parent else None,
        name=readable_span.name,
        status=TraceStatus(
            status_code=readable_span.status.status_code.name, description=readable_span.status.description
        ),
        attributes=plain(readable_span.attributes),
        events=[
            {"name": e.name, "attributes": plain(e.attributes), "timestamp": seconds(e.timestamp)}
            for e in readable_span.events
        ],
        links=[{"context": context(link.context), "attributes": plain(link.attributes)} for link in readable_span.links],
        start_time=seconds(readable_span.start_time),
        end_time=seconds(readable_span.end_time),
        context=own,
        parent=parent,
        resource={
            "attributes": plain(resource.attributes if resource else {}),
            "schema_url": (resource.schema_url if resource else "") or "",
        },
    )


# === operations (run on the connection thread) ===============================================
# Readers take the sqlite3 connection; writers take a _Txn and run inside `atomic()`.


def _fetchone(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    return conn.execute(sql, params).fetchone()


def _next_counter(conn: sqlite3.Connection, name: str, by: int = 1) -> int:
    """Advance a shared counter by `by`; returns its new value (the last one issued)."""
    return conn.execute(
        "INSERT INTO counters (name, value) VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value RETURNING value",
        (name, by),
    ).fetchall()[0][0]


def _get_rollout(conn: sqlite3.Connection, rollout_id: str) -> Optional[Rollout]:
    row = _fetchone(conn, ROLLOUT_SELECT + " WHERE r.rollout_id = ?", (rollout_id,))
    return None if row is None else rollout_from_row(row)


def _require_rollout(conn: sqlite3.Connection, rollout_id: str) -> Rollout:
    rollout = _get_rollout(conn, rollout_id)
    if rollout is None:
        raise NotFoundError(f"rollout {rollout_id!r} not found")
    return rollout


def _get_rollouts(conn: sqlite3.Connection, rollout_ids: List[str]) -> Dict[str, Rollout]:
    rows = conn.execute(
        ROLLOUT_SELECT + " WHERE r.rollout_id IN (SELECT value FROM json_each(?))", (orjson.dumps(rollout_ids),)
    ).fetchall()
    return {row[0]: rollout_from_row(row) for row in rows}


def _rollout_statuses(conn: sqlite3.Connection, rollout_ids: List[str]) -> Dict[str, str]:
    rows = conn.execute(
        "SELECT rollout_id, status FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))",
        (orjson.dumps(rollout_ids),),
    ).fetchall()
    statuses = dict(rows)
    missing = [rid for rid in rollout_ids if rid not in statuses]
    if missing:
        raise NotFoundError(f"rollouts not found: {missing[:10]}")
    return statuses


def _get_latest_attempt(conn: sqlite3.Connection, rollout_id: str) -> Optional[Attempt]:
    rollout = _fetchone(conn, "SELECT latest_attempt_id FROM rollouts WHERE rollout_id = ?", (rollout_id,))
    if rollout is None:
        raise NotFoundError(f"rollout {rollout_id!r} not found")
    if rollout[0] is None:
        return None
    return _get_attempt(conn, rollout_id, rollout[0])


def _get_attempt(conn: sqlite3.Connection, rollout_id: str, attempt_id: str) -> Optional[Attempt]:
    row = _fetchone(
        conn, f"SELECT {ATTEMPT_COLUMNS} FROM attempts a WHERE a.rollout_id = ? AND a.attempt_id = ?", (rollout_id, attempt_id)
    )
    return None if row is None else attempt_from_row(row)


def _run_paged(conn: sqlite3.Connection, query: _PagedQuery, decode: Callable[[Any], T]) -> Page[T]:
    rows = conn.execute(
        query.select + query.where + query.order + " LIMIT ? OFFSET ?", (*query.params, query.limit, query.offset)
    ).fetchall()
    if query.offset == 0 and (query.limit < 0 or len(rows) < query.limit):
        total = len(rows)  # the page holds every match: no need to count
    else:
        total = conn.execute(query.count + query.where, query.params).fetchone()[0]
    return Page([decode(row) for row in rows], total)


def _query_spans(conn: sqlite3.Connection, query: _PagedQuery, latest: bool) -> Page[Span]:
    if latest:
        row = _fetchone(conn, "SELECT latest_attempt_id FROM rollouts WHERE rollout_id = ?", (query.params[0],))
        if row is None or row[0] is None:
            return Page([], 0)
        query.params[1] = row[0]
    return _run_paged(conn, query, span_from_row)


def _insert_rollout(txn: _Txn, new: _NewRollout, status: str, queue_seq: Optional[int], attempt: Optional[Attempt]) -> None:
    rollout = new.rollout
    config = rollout.config
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
            new.row_config,
            new.row_metadata,
            queue_seq,
            0 if attempt is None else attempt.sequence_id,
            None if attempt is None else attempt.attempt_id,
            config.timeout_seconds,
            config.unresponsive_seconds,
        ),
    )


def _new_attempt(txn: _Txn, rollout_id: str, sequence_id: int, worker_id: Optional[str]) -> Attempt:
    return Attempt(
        rollout_id=rollout_id,
        attempt_id=new_id("at"),
        sequence_id=sequence_id,
        start_time=txn.now,
        status="preparing",
        worker_id=worker_id,
    )


def _insert_attempt(txn: _Txn, attempt: Attempt) -> None:
    txn.conn.execute(
        "INSERT INTO attempts (rollout_id, attempt_id, sequence_id, start_time, status, worker_id) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (attempt.rollout_id, attempt.attempt_id, attempt.sequence_id, attempt.start_time, "preparing", attempt.worker_id),
    )


def _latest_resources_id(conn: sqlite3.Connection) -> Optional[str]:
    row = _fetchone(conn, "SELECT resources_id FROM resources ORDER BY touched DESC LIMIT 1")
    return None if row is None else row[0]


def _start_rollout(txn: _Txn, new: _NewRollout, worker_id: Optional[str]) -> AttemptedRollout:
    rollout = new.rollout
    if rollout.resources_id is None:
        rollout.resources_id = _latest_resources_id(txn.conn)
    attempt = _new_attempt(txn, rollout.rollout_id, 1, worker_id)
    _insert_rollout(txn, new, "preparing", None, attempt)
    _insert_attempt(txn, attempt)
    if worker_id:
        _sync_worker(txn, worker_id, attempt)
    return AttemptedRollout(**{**dict(rollout), "status": "preparing"}, attempt=attempt)


def _enqueue_rollouts(txn: _Txn, news: List[_NewRollout]) -> List[Rollout]:
    last = _next_counter(txn.conn, "queue", len(news))
    out = []
    for position, new in enumerate(news, start=last - len(news) + 1):
        _insert_rollout(txn, new, "queuing", position, None)
        out.append(Rollout(**dict(new.rollout)))
    return out


def _dequeue(txn: _Txn, limit: int, worker_id: Optional[str]) -> List[AttemptedRollout]:
    rows = txn.conn.execute(
        ROLLOUT_SELECT + " WHERE r.queue_seq IS NOT NULL ORDER BY r.queue_seq LIMIT ?", (limit,)
    ).fetchall()
    claimed = []
    for row in rows:
        rollout = rollout_from_row(row)
        previous = rollout.attempt.sequence_id if isinstance(rollout, AttemptedRollout) else 0
        attempt = _new_attempt(txn, rollout.rollout_id, previous + 1, worker_id)
        _insert_attempt(txn, attempt)
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
            _sync_worker(txn, worker_id, claimed[-1].attempt, dequeued=True)
        else:
            _mark_worker_idle(txn, worker_id)
    return claimed


def _start_attempt(txn: _Txn, rollout_id: str, worker_id: Optional[str]) -> AttemptedRollout:
    row = _fetchone(txn.conn, "SELECT status, attempt_count FROM rollouts WHERE rollout_id = ?", (rollout_id,))
    if row is None:
        raise NotFoundError(f"rollout {rollout_id!r} not found")
    status, count = row
    check_rollout_move(rollout_id, status, "preparing")
    attempt = _new_attempt(txn, rollout_id, count + 1, worker_id)
    _insert_attempt(txn, attempt)
    txn.conn.execute(
        "UPDATE rollouts SET attempt_count = ?, latest_attempt_id = ? WHERE rollout_id = ?",
        (attempt.sequence_id, attempt.attempt_id, rollout_id),
    )
    _move_rollout(txn, rollout_id, status, "preparing")
    if worker_id:
        _sync_worker(txn, worker_id, attempt)
    rollout = _require_rollout(txn.conn, rollout_id)
    assert isinstance(rollout, AttemptedRollout)
    return rollout


def _move_rollout(txn: _Txn, rollout_id: str, old: str, new: str) -> None:
    """The one place a rollout's status changes: checks the move, keeps the queue and
    `end_time` in step, and records finishes for the waiters."""
    check_rollout_move(rollout_id, old, new)
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
            "UPDATE rollouts SET status = ?, queue_seq = ? WHERE rollout_id = ?",
            (new, _next_counter(conn, "queue"), rollout_id),
        )
    elif new in QUEUED_ROLLOUT_STATUSES:
        conn.execute("UPDATE rollouts SET status = ? WHERE rollout_id = ?", (new, rollout_id))
    else:
        conn.execute("UPDATE rollouts SET status = ?, queue_seq = NULL WHERE rollout_id = ?", (new, rollout_id))


def _update_rollout(txn: _Txn, rollout_id: str, columns: Dict[str, Any], status: Any) -> Rollout:
    row = _fetchone(txn.conn, "SELECT status FROM rollouts WHERE rollout_id = ?", (rollout_id,))
    if row is None:
        raise NotFoundError(f"rollout {rollout_id!r} not found")
    old = row[0]
    if old in TERMINAL_ROLLOUT_STATUSES and (set(columns) - {"metadata"} or (status is not UNSET and status != old)):
        raise ConflictError(f"rollout {rollout_id} is {old}: only its metadata may change")
    if status is not UNSET:
        _move_rollout(txn, rollout_id, old, status)
    if columns:
        assignments = ", ".join(f"{column} = ?" for column in columns)
        txn.conn.execute(f"UPDATE rollouts SET {assignments} WHERE rollout_id = ?", (*columns.values(), rollout_id))
    return _require_rollout(txn.conn, rollout_id)


def _update_attempt(txn: _Txn, rollout_id: str, attempt_id: str, changes: _AttemptChanges) -> Attempt:
    row = _fetchone(txn.conn, "SELECT status, config, latest_attempt_id FROM rollouts WHERE rollout_id = ?", (rollout_id,))
    if row is None:
        raise NotFoundError(f"rollout {rollout_id!r} not found")
    rollout_status, config, latest_id = row
    if attempt_id == "latest":
        if latest_id is None:
            raise NotFoundError(f"rollout {rollout_id!r} has no attempts")
        attempt_id = latest_id
    attempt = _get_attempt(txn.conn, rollout_id, attempt_id)
    if attempt is None:
        raise NotFoundError(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found")
    return _change_attempt(
        txn, attempt, rollout_status, RolloutConfig.model_validate(orjson.loads(config)), latest_id, changes
    )


def _change_attempt(
    txn: _Txn,
    attempt: Attempt,
    rollout_status: str,
    config: RolloutConfig,
    latest_id: Optional[str],
    changes: _AttemptChanges,
) -> Attempt:
    """The one place an attempt's status changes, with propagation to rollout and worker."""
    updates: Dict[str, Any] = {}
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
        "UPDATE attempts SET status = ?, end_time = ?, worker_id = ?, last_heartbeat_time = ?, metadata = ? "
        "WHERE rollout_id = ? AND attempt_id = ?",
        (
            new.status,
            new.end_time,
            new.worker_id,
            new.last_heartbeat_time,
            None if new.metadata is None else orjson.dumps(new.metadata),
            new.rollout_id,
            new.attempt_id,
        ),
    )
    if status is not UNSET and new.attempt_id == latest_id and rollout_status not in TERMINAL_ROLLOUT_STATUSES:
        target = rollout_status_from_attempt(new.status, new.sequence_id, config)
        _move_rollout(txn, new.rollout_id, rollout_status, target)
    if new.worker_id and (status is not UNSET or changes.worker_id is not UNSET):
        _sync_worker(txn, new.worker_id, new)
    return new


def _sync_worker(txn: _Txn, worker_id: str, attempt: Attempt, dequeued: bool = False) -> None:
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


def _mark_worker_idle(txn: _Txn, worker_id: str) -> None:
    """A dequeue that found nothing: the worker is idle (since now, unless it already was)."""
    txn.conn.execute(
        "INSERT INTO workers (worker_id, status, last_idle_time, last_dequeue_time) VALUES (?, 'idle', ?, ?) "
        "ON CONFLICT (worker_id) DO UPDATE SET "
        "last_idle_time = CASE WHEN status = 'idle' THEN last_idle_time ELSE excluded.last_idle_time END, "
        "status = 'idle', last_dequeue_time = excluded.last_dequeue_time, "
        "current_rollout_id = NULL, current_attempt_id = NULL",
        (worker_id, txn.now, txn.now),
    )


def _heartbeat_worker(txn: _Txn, worker_id: str, stats: Any) -> Worker:
    if stats is UNSET:
        txn.conn.execute(
            "INSERT INTO workers (worker_id, status, last_heartbeat_time) VALUES (?, 'unknown', ?) "
            "ON CONFLICT (worker_id) DO UPDATE SET last_heartbeat_time = excluded.last_heartbeat_time",
            (worker_id, txn.now),
        )
    else:
        txn.conn.execute(
            "INSERT INTO workers (worker_id, status, last_heartbeat_time, heartbeat_stats) VALUES (?, 'unknown', ?, ?) "
            "ON CONFLICT (worker_id) DO UPDATE SET last_heartbeat_time = excluded.last_heartbeat_time, "
            "heartbeat_stats = excluded.heartbeat_stats",
            (worker_id, txn.now, stats),
        )
    worker = _get_worker(txn.conn, worker_id)
    assert worker is not None
    return worker


def _get_worker(conn: sqlite3.Connection, worker_id: str) -> Optional[Worker]:
    row = _fetchone(conn, f"SELECT {WORKER_COLUMNS} FROM workers WHERE worker_id = ?", (worker_id,))
    return None if row is None else worker_from_row(row)


# --- spans and sequence ids -------------------------------------------------------------------


def _attempt_states(txn: _Txn, pairs: Sequence[Tuple[str, str]]) -> Dict[Tuple[str, str], Tuple[str, str, bool]]:
    """(attempt status, rollout status, is latest) of each attributed pair; NotFoundError
    for an unknown rollout or attempt. Unattributed pairs (rollout "") are skipped."""
    states = {}
    for rollout_id, attempt_id in dict.fromkeys(pairs):
        if rollout_id == UNATTRIBUTED_ROLLOUT_ID:
            continue
        row = _fetchone(
            txn.conn,
            "SELECT a.status, r.status, r.latest_attempt_id = a.attempt_id FROM attempts a "
            "JOIN rollouts r ON r.rollout_id = a.rollout_id WHERE a.rollout_id = ? AND a.attempt_id = ?",
            (rollout_id, attempt_id),
        )
        if row is None:
            if _fetchone(txn.conn, "SELECT 1 FROM rollouts WHERE rollout_id = ?", (rollout_id,)) is None:
                raise NotFoundError(f"rollout {rollout_id!r} not found")
            raise NotFoundError(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found")
        states[(rollout_id, attempt_id)] = (row[0], row[1], bool(row[2]))
    return states


def _advance_sequence(conn: sqlite3.Connection, rollout_id: str, floor: int, count: int) -> int:
    """Push the rollout's counter to at least `floor`, then issue `count` numbers after it;
    returns the counter's new value (the last number issued)."""
    return conn.execute(
        "INSERT INTO span_counters (rollout_id, value) VALUES (?, ?) "
        "ON CONFLICT (rollout_id) DO UPDATE SET value = max(value, ?) + ? RETURNING value",
        (rollout_id, floor + count, floor, count),
    ).fetchall()[0][0]


def _issue_sequence_ids(txn: _Txn, pairs: List[Tuple[str, str]]) -> List[int]:
    _attempt_states(txn, pairs)
    counts: Dict[str, int] = {}
    for rollout_id, _ in pairs:
        counts[rollout_id] = counts.get(rollout_id, 0) + 1
    next_ids = {rid: _advance_sequence(txn.conn, rid, 0, n) - n + 1 for rid, n in counts.items()}
    issued = []
    for rollout_id, _ in pairs:
        issued.append(next_ids[rollout_id])
        next_ids[rollout_id] += 1
    return issued


_INSERT_SPAN = f"INSERT OR IGNORE INTO spans ({SPAN_COLUMNS}) VALUES ({', '.join('?' * 13)})"


def _add_spans(txn: _Txn, encoded: List[_EncodedSpan]) -> List[Span]:
    conn = txn.conn
    pairs = [(e.span.rollout_id, e.span.attempt_id) for e in encoded]
    states = _attempt_states(txn, pairs)

    # Sequence ids: push each rollout's counter past the ids spans bring, then issue the rest.
    floors: Dict[str, int] = {}
    missing: Dict[str, int] = {}
    for e in encoded:
        rid, seq = e.span.rollout_id, e.span.sequence_id
        if seq is None:
            missing[rid] = missing.get(rid, 0) + 1
        else:
            floors[rid] = max(floors.get(rid, 0), seq)
    next_ids = {}
    for rid in floors.keys() | missing.keys():
        count = missing.get(rid, 0)
        next_ids[rid] = _advance_sequence(conn, rid, floors.get(rid, 0), count) - count + 1
    rows = []
    issued: List[Optional[int]] = []
    for e in encoded:
        if e.span.sequence_id is None:
            seq = next_ids[e.span.rollout_id]
            next_ids[e.span.rollout_id] = seq + 1
            rows.append(e.row[:2] + (seq,) + e.row[3:])
            issued.append(seq)
        else:
            rows.append(e.row)
            issued.append(None)

    if len(rows) == 1:
        keep = [conn.execute(_INSERT_SPAN, rows[0]).rowcount == 1]
    else:
        keep = _insert_many(conn, rows)

    stored = []
    touched = set()
    for e, seq, ok in zip(encoded, issued, keep):
        if not ok:
            continue
        stored.append(e.span if seq is None else e.span.model_copy(update={"sequence_id": seq}))
        touched.add((e.span.rollout_id, e.span.attempt_id))
    for pair in touched:
        if pair in states:
            _on_heartbeat(txn, pair, states[pair])
    return stored


def _insert_many(conn: sqlite3.Connection, rows: List[tuple]) -> List[bool]:
    """Insert span rows in one statement; which of them went in (duplicates are ignored)."""
    before = conn.execute("SELECT coalesce(max(pk), 0) FROM spans").fetchone()[0]
    if conn.executemany(_INSERT_SPAN, rows).rowcount == len(rows):
        return [True] * len(rows)
    # Some were duplicates: the rows that went in are exactly those past `before`, as we
    # hold the write lock.
    new_keys = set(conn.execute("SELECT rollout_id, attempt_id, span_id FROM spans WHERE pk > ?", (before,)))
    keep, seen = [], set()
    for row in rows:
        key = (row[0], row[1], row[4])
        keep.append(key in new_keys and key not in seen)
        seen.add(key)
    return keep


def _on_heartbeat(txn: _Txn, pair: Tuple[str, str], state: Tuple[str, str, bool]) -> None:
    """A span arrived for an attempt: it is alive; a preparing (or unresponsive) attempt and
    its rollout, if this is its latest attempt, are now running."""
    rollout_id, attempt_id = pair
    attempt_status, rollout_status, is_latest = state
    if attempt_status in ("preparing", "unresponsive"):
        txn.conn.execute(
            "UPDATE attempts SET last_heartbeat_time = ?, status = 'running', end_time = NULL "
            "WHERE rollout_id = ? AND attempt_id = ?",
            (txn.now, rollout_id, attempt_id),
        )
        if is_latest and rollout_status in ("preparing", "queuing", "requeuing"):
            _move_rollout(txn, rollout_id, rollout_status, "running")
    else:
        txn.conn.execute(
            "UPDATE attempts SET last_heartbeat_time = ? WHERE rollout_id = ? AND attempt_id = ?",
            (txn.now, rollout_id, attempt_id),
        )


# --- watchdog -----------------------------------------------------------------------------------

_UNHEALTHY_SQL = (
    # Latest attempts of active rollouts past their timeout (since the attempt started) or
    # silent past unresponsive_seconds (since the last heartbeat, or the start if none).
    f"SELECT {ROLLOUT_COLUMNS}, {ATTEMPT_COLUMNS}, "
    "CASE WHEN r.timeout_seconds IS NOT NULL AND :now - a.start_time > r.timeout_seconds "
    "THEN 'timeout' ELSE 'unresponsive' END "
    "FROM rollouts r JOIN attempts a ON a.rollout_id = r.rollout_id AND a.attempt_id = r.latest_attempt_id "
    "WHERE r.status IN ('preparing', 'running') AND a.status IN ('preparing', 'running') "
    "AND ((r.timeout_seconds IS NOT NULL AND :now - a.start_time > r.timeout_seconds) "
    "OR (r.unresponsive_seconds IS NOT NULL "
    "AND :now - coalesce(a.last_heartbeat_time, a.start_time) > r.unresponsive_seconds))"
)


def _find_unhealthy(conn: sqlite3.Connection, now: float) -> List[Tuple[Rollout, str]]:
    rows = conn.execute(_UNHEALTHY_SQL, {"now": now}).fetchall()
    return [(rollout_from_row(row[:18]), row[18]) for row in rows]


def _mark_unhealthy(txn: _Txn) -> int:
    # Re-checked under the write lock: another process may have handled these already.
    marked = _find_unhealthy(txn.conn, txn.now)
    for rollout, status in marked:
        assert isinstance(rollout, AttemptedRollout)
        changes = _AttemptChanges(status, UNSET, UNSET, UNSET)
        _change_attempt(txn, rollout.attempt, rollout.status, rollout.config, rollout.attempt.attempt_id, changes)
    return len(marked)


# --- resources, statistics, retention -----------------------------------------------------------


def _put_resources(txn: _Txn, resources_id: str, encoded: Tuple[NamedResources, bytes], update: bool) -> ResourcesUpdate:
    resources, blob = encoded
    touched = _next_counter(txn.conn, "resources")
    row = _fetchone(txn.conn, "SELECT create_time, version FROM resources WHERE resources_id = ?", (resources_id,))
    if row is None:
        create_time, version = txn.now, 1
        txn.conn.execute(
            "INSERT INTO resources (resources_id, create_time, update_time, version, resources, touched) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (resources_id, create_time, txn.now, version, blob, touched),
        )
    elif not update:
        raise ConflictError(f"resources {resources_id!r} already exist")
    else:
        create_time, version = row[0], row[1] + 1
        txn.conn.execute(
            "UPDATE resources SET update_time = ?, version = ?, resources = ?, touched = ? WHERE resources_id = ?",
            (txn.now, version, blob, touched, resources_id),
        )
    return ResourcesUpdate(
        resources_id=resources_id, create_time=create_time, update_time=txn.now, version=version, resources=resources
    )


def _get_resources(conn: sqlite3.Connection, resources_id: Optional[str]) -> Optional[ResourcesUpdate]:
    if resources_id is None:
        row = _fetchone(conn, f"SELECT {RESOURCES_COLUMNS} FROM resources ORDER BY touched DESC LIMIT 1")
    else:
        row = _fetchone(conn, f"SELECT {RESOURCES_COLUMNS} FROM resources WHERE resources_id = ?", (resources_id,))
    return None if row is None else resources_from_row(row)


def _statistics(conn: sqlite3.Connection) -> Dict[str, Any]:
    def count(table: str) -> int:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]

    by_status = dict(conn.execute("SELECT status, count(*) FROM rollouts GROUP BY status").fetchall())
    page_count = conn.execute("PRAGMA page_count").fetchone()[0]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    return {
        "total_rollouts": sum(by_status.values()),
        "total_attempts": count("attempts"),
        "total_spans": count("spans"),
        "total_resources": count("resources"),
        "total_workers": count("workers"),
        "rollouts_by_status": by_status,
        "page_bytes": page_count * page_size,
    }


def _delete_rows(conn: sqlite3.Connection, ids: List[str]) -> None:
    blob = orjson.dumps(ids)
    for table in ("spans", "span_counters", "attempts", "rollouts"):
        conn.execute(f"DELETE FROM {table} WHERE rollout_id IN (SELECT value FROM json_each(?))", (blob,))


def _delete_rollouts(txn: _Txn, ids: List[str]) -> int:
    rows = txn.conn.execute(
        "SELECT rollout_id, status FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))",
        (orjson.dumps(ids),),
    ).fetchall()
    unfinished = [rid for rid, status in rows if status not in TERMINAL_ROLLOUT_STATUSES]
    if unfinished:
        raise ConflictError(f"rollouts not finished, nothing deleted: {unfinished[:10]}")
    found = [rid for rid, _ in rows]
    _delete_rows(txn.conn, found)
    return len(found)


def _expire_rollouts(txn: _Txn, older_than_seconds: float) -> int:
    ids = [
        row[0]
        for row in txn.conn.execute(
            f"SELECT rollout_id FROM rollouts WHERE status IN {_TERMINAL_SQL} AND end_time < ?",
            (txn.now - older_than_seconds,),
        )
    ]
    _delete_rows(txn.conn, ids)
    return len(ids)
