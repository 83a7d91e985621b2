"""SQLiteStore: the embedded LightningStore, on a SQLite file or in memory (`:memory:`).

Each operation is one plain function of `agl_store.sqlite_ops`, run whole on a connection's
own thread (`sqlite_threads`): one thread hop per call instead of one per statement. Writes
go to the one writer connection, whose thread runs one function at a time, so the store's
writes are serialised. Every write runs inside `sqlite_ops.atomic()` (`BEGIN IMMEDIATE`),
which also serialises writers across processes sharing the file, so sequence numbers and
dequeues stay unique without any lock of our own. Reads of a file run on separate reader
connections, each in one snapshot: WAL lets them proceed while a write (a long retention
chunk, another process's transaction) is in progress. An in-memory database exists only in
its one connection, so there reads share the writer's.

This module is the async face: lifecycle, input validation (before any transaction, so bad
input never takes the write lock), waiting, and the watchdog task. A background task started
by `open()` marks timed-out and unresponsive attempts; it is a conditional write, so
several processes running it at once is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Tuple, TypeVar

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from ..base import UNSET, FilterLogic, LightningStore, SortOrder
from ..bounds import check_field_depths, check_integer, check_json_depth
from ..errors import InvalidInputError, StoreClosedError, StoreError, invalid_sort_by
from ..models import (
    ROLLOUT_MODES,
    TERMINAL_ROLLOUT_STATUSES,
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
    StoreStatistics,
    TaskInput,
    Worker,
    WorkerStatus,
    new_id,
)
from ..otel import span_from_otel
from ..pages import Page
from . import attempts, queries, queue, retention, statistics, transactions, watchdog, workers
from .resources import get_resources, put_resources
from .rollouts import get_rollout, get_rollouts, rollout_statuses
from .rollout_pages import read_rollout_page, rollout_page_query
from .schema import (
    ATTEMPT_COLUMNS,
    RESOURCES_COLUMNS,
    SPAN_COLUMNS,
    WORKER_COLUMNS,
    apply_migrations,
    attempt_from_row,
    configure_connection,
    configure_reader,
    resources_from_row,
    span_from_row,
    span_to_row,
    worker_from_row,
)
from .spans import EncodedSpan, add_spans, issue_sequence_ids, read_span_page
from .threads import ConnectionThread, ReaderPool
from ..tokens import check_packed_batch
from ..transitions import check_attempt_status, check_rollout_status, check_worker_status

__all__ = ["Page", "SQLiteStore", "UNATTRIBUTED_ROLLOUT_ID", "span_from_otel"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_WRITES_PER_COMMIT = 256
"""Concurrent writes grouped into one transaction at most; bounds a commit's size."""
RECLAIM_PAGES_PER_STEP = 2048
"""Free pages one transaction gives back to the file system after retention (8 MB of 4 KB pages)."""
WAL_TRUNCATE_WAIT_S = 2.0
"""How long truncating the WAL after retention waits for readers of older snapshots."""
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


class SQLiteStore(LightningStore):
    """A LightningStore on one SQLite database: a file path, or `":memory:"`.

    Args:
        path: the database file (created with its parent folders) or `":memory:"`.
        watchdog_interval: seconds between the background scans for timed-out and
            unresponsive attempts.
        poll_interval: how often `wait_for_rollouts` re-reads the database to notice other
            processes' writes (this process's own writes wake it at once).
        busy_timeout: seconds a write waits for another process's transaction to end.
        read_connections: connections serving reads of a file, beside the writer's
            (an in-memory store reads on its one connection).
        retention_chunk_spans: the most spans one transaction of `delete_rollouts` or
            `expire_rollouts` removes; other calls run between these transactions.
    """

    name = "SQLiteStore"

    def __init__(
        self,
        path: str | os.PathLike[str] = ":memory:",
        *,
        watchdog_interval: float = 1.0,
        poll_interval: float = 0.5,
        busy_timeout: float = 30.0,
        read_connections: int = 2,
        retention_chunk_spans: int = 500,
    ) -> None:
        if watchdog_interval <= 0:
            raise InvalidInputError(f"watchdog_interval must be > 0, got {watchdog_interval}")
        if poll_interval <= 0:
            raise InvalidInputError(f"poll_interval must be > 0, got {poll_interval}")
        if read_connections < 1:
            raise InvalidInputError(f"read_connections must be >= 1, got {read_connections}")
        if retention_chunk_spans < 1:
            raise InvalidInputError(f"retention_chunk_spans must be >= 1, got {retention_chunk_spans}")
        self.path = str(path)
        self.in_memory = self.path == ":memory:"
        self.watchdog_interval = watchdog_interval
        self.poll_interval = poll_interval
        self.busy_timeout = busy_timeout
        self.read_connections = read_connections
        self.retention_chunk_spans = retention_chunk_spans
        self._writer: ConnectionThread | None = None
        self._readers: ReaderPool | None = None
        self._closed = False
        self._watchdog: asyncio.Task[None] | None = None
        self._pending_writes: List[Tuple[Callable[..., Any], Tuple[Any, ...], asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._finished_event: asyncio.Event | None = None
        self._opened_at = time.time()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._writer is not None else "new"
        return f"SQLiteStore({self.path!r}, {state})"

    # --- lifecycle -----------------------------------------------------------------------

    async def open(self) -> "SQLiteStore":
        """Connect, apply pending migrations and start the watchdog. Idempotent."""
        if self._closed:
            raise StoreClosedError("this SQLiteStore was closed; create a new one")
        if self._writer is not None:
            return self
        if not self.in_memory:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        busy_timeout_ms = int(self.busy_timeout * 1000)

        def set_up_writer(conn: sqlite3.Connection) -> None:
            configure_connection(conn, busy_timeout_ms=busy_timeout_ms, in_memory=self.in_memory)
            apply_migrations(conn)

        writer = await ConnectionThread.open(self.path, "agl-store-writer", set_up_writer)
        readers: List[ConnectionThread] = []
        try:
            if not self.in_memory:  # after the writer: the file is in WAL mode and migrated
                set_up_reader = functools.partial(configure_reader, busy_timeout_ms=busy_timeout_ms)
                for _ in range(self.read_connections):
                    readers.append(await ConnectionThread.open(self.path, "agl-store-reader", set_up_reader))
        except BaseException:
            for opened in (*readers, writer):
                await opened.close()
            raise
        self._writer = writer
        self._readers = ReaderPool(readers) if readers else None
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
        if self._flusher is not None:
            # Writes accepted before close() still commit; later ones get StoreClosedError.
            await asyncio.gather(self._flusher, return_exceptions=True)
        self._wake_waiters()
        if self._readers is not None:
            await self._readers.close()
        if self._writer is not None:
            await self._writer.close()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run the read `fn(conn, *args)` in one snapshot, on a reader connection's thread."""
        self._check_open()
        try:
            if self._readers is None:
                assert self._writer is not None
                return await self._writer.run(transactions.in_snapshot, fn, *args)
            return await self._readers.run(transactions.in_snapshot, fn, *args)
        except sqlite3.Error as exc:
            raise _store_error(exc) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")
        if self._writer is None:
            raise StoreClosedError("the store is not open; call `await store.open()` first")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)` on the writer connection's thread."""
        # Without the open check: the write flusher finishes accepted writes during close().
        assert self._writer is not None
        try:
            return await self._writer.run(fn, *args)
        except sqlite3.Error as exc:
            raise _store_error(exc) from exc

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(txn, *args)` as one transaction; returns once it is committed.

        Writes that arrive while another batch is committing are grouped into the next
        one: one thread hop and one commit for many concurrent calls (say, 16 proxies'
        `add_span`), each in its own savepoint so one call's error undoes only its own
        changes.
        """
        self._check_open()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending_writes.append((fn, args, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_writes())
        return await future

    async def _flush_writes(self) -> None:
        while self._pending_writes:
            batch = self._pending_writes[:MAX_WRITES_PER_COMMIT]
            del self._pending_writes[:MAX_WRITES_PER_COMMIT]
            try:
                outcomes = await self._run(transactions.run_writes, [(fn, args) for fn, args, _ in batch])
            except BaseException as exc:  # nothing of the batch was committed
                outcomes = [(False, exc, ())] * len(batch)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            finished = False
            for (_, _, future), (ok, value, finished_ids) in zip(batch, outcomes, strict=True):
                finished = finished or bool(finished_ids)
                if future.done():  # the caller was cancelled; the write stands
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(_store_error(value))
            if finished:
                self._wake_waiters()

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
        if not await self._call(watchdog.any_unhealthy, time.time()):  # the common case takes no write lock
            return 0
        return await self._write(watchdog.mark_unhealthy)

    async def statistics(self) -> StoreStatistics:
        stats = await self._call(statistics.read_statistics)
        files: Dict[str, Any] = {"database_bytes": None, "wal_bytes": None, "unused_bytes": None}
        if not self.in_memory:
            database, wal = _file_bytes(Path(self.path)), _file_bytes(Path(self.path + "-wal"))
            files = {"database_bytes": database + wal, "wal_bytes": wal, "unused_bytes": stats["unused_bytes"]}
        stats.update(files)
        return StoreStatistics(name=self.name, uptime=time.time() - self._opened_at, **stats)

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
        return await self._write(queue.start_rollout, new, worker_id)

    async def enqueue_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: Dict[str, Any] | None = None,
    ) -> Rollout:
        new = _new_rollout(input, mode, resources_id, config, metadata)
        return (await self._write(queue.enqueue_rollouts, [new]))[0]

    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> Sequence[Rollout]:
        news = []
        for index, request in enumerate(rollouts):
            if isinstance(request, dict):
                request = _validate(EnqueueRolloutRequest, request, f"rollouts[{index}]")
            news.append(
                _new_rollout(request.input, request.mode, request.resources_id, request.config, request.metadata)
            )
        if not news:
            return []
        return await self._write(queue.enqueue_rollouts, news)

    async def dequeue_rollout(self, worker_id: Optional[str] = None) -> Optional[AttemptedRollout]:
        claimed = await self._write(queue.dequeue, 1, worker_id)
        return claimed[0] if claimed else None

    async def dequeue_many_rollouts(
        self, *, limit: int = 1, worker_id: Optional[str] = None
    ) -> Sequence[AttemptedRollout]:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidInputError(f"limit must be an int >= 0, got {limit!r}")
        if check_integer(limit, "limit") == 0:
            return []
        return await self._write(queue.dequeue, limit, worker_id)

    async def start_attempt(self, rollout_id: str, worker_id: Optional[str] = None) -> AttemptedRollout:
        return await self._write(queue.start_attempt, rollout_id, worker_id)

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
        return await self._write(queue.update_rollout, rollout_id, columns, status)

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"],
        status: AttemptStatus = UNSET,
        worker_id: str = UNSET,
        last_heartbeat_time: float = UNSET,
        metadata: Dict[str, Any] = UNSET,
    ) -> Attempt:
        if status is not UNSET:
            check_attempt_status(status)
        if last_heartbeat_time is not UNSET:
            _check_number(last_heartbeat_time, "last_heartbeat_time")
        # An attempt's worker and metadata are replaced, never cleared (agent-lightning 0.3's server says so too).
        for field, value in (("worker_id", worker_id), ("metadata", metadata)):
            if value is None:
                raise InvalidInputError(f"{field} is invalid; it cannot be a null value.")
        if metadata is not UNSET:
            _dumps(_check_metadata(metadata), "metadata")  # the connection thread encodes it again
        changes = attempts.AttemptChanges(status, worker_id, last_heartbeat_time, metadata)
        return await self._write(attempts.update_attempt, rollout_id, attempt_id, changes)

    async def get_rollout_by_id(self, rollout_id: str) -> Optional[Rollout]:
        return await self._call(get_rollout, rollout_id)

    async def get_latest_attempt(self, rollout_id: str) -> Optional[Attempt]:
        return await self._call(attempts.get_latest_attempt, rollout_id)

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
        statuses = None
        if status_in is not None:
            statuses = [check_rollout_status(s, "status_in") for s in _as_list(status_in, "status_in")]
        where = _Where()
        if rollout_id_in is not None:
            where.add(
                "r.rollout_id IN (SELECT value FROM json_each(?))",
                orjson.dumps(_as_list(rollout_id_in, "rollout_id_in")),
            )
        if rollout_id_contains is not None:
            where.add("instr(r.rollout_id, ?) > 0", rollout_id_contains)
        if mode is not None:
            where.add("r.mode = ?", _check_mode(mode))
        if start_time_after is not None:
            where.add("r.start_time > ?", _check_number(start_time_after, "start_time_after"))
        if start_time_before is not None:
            where.add("r.start_time < ?", _check_number(start_time_before, "start_time_before"))
        _check_sort(sort_by, ROLLOUT_SORT_FIELDS, sort_order)
        _check_paging(limit, offset)
        query = rollout_page_query(
            statuses=statuses,
            clauses=where.clauses,
            params=where.params,
            logic=_check_logic(filter_logic),
            sort_by=sort_by,
            descending=sort_order == "desc",
            limit=limit,
            offset=offset,
        )
        return await self._call(read_rollout_page, query)

    async def query_attempts(
        self,
        rollout_id: str,
        *,
        sort_by: Optional[str] = "sequence_id",
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Sequence[Attempt]:
        query = _paged(
            select=f"SELECT {ATTEMPT_COLUMNS} FROM attempts a",
            count="SELECT count(*) FROM attempts a",
            where=" WHERE a.rollout_id = ?",
            params=[rollout_id],
            order=_order_by("a", sort_by, ATTEMPT_SORT_FIELDS, sort_order, default="a.sequence_id"),
            limit=limit,
            offset=offset,
        )
        return await self._call(queries.run_paged, query, attempt_from_row)

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
            # Unknown (or since deleted) ids are not waited for, as in agent-lightning 0.3.
            statuses = await self._call(rollout_statuses, ids)
            finished = [rid for rid in ids if statuses.get(rid) in TERMINAL_ROLLOUT_STATUSES]
            remaining = None if deadline is None else deadline - loop.time()
            if len(finished) == len(statuses) or (remaining is not None and remaining <= 0):
                rollouts = await self._call(get_rollouts, finished)
                # A finished rollout stays finished, but it may have been deleted meanwhile.
                return [rollouts[rid] for rid in finished if rid in rollouts]
            wait = self.poll_interval if remaining is None else min(self.poll_interval, remaining)
            if event is None:
                raise StoreClosedError("the store is not open")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), wait)

    # --- spans ---------------------------------------------------------------------------

    async def add_span(self, span: Span) -> Optional[Span]:
        stored = await self._write(add_spans, [_encode_span(span, 0)])
        return stored[0] if stored else None

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        encoded = [_encode_span(span, index) for index, span in enumerate(spans)]
        if not encoded:
            return []
        return await self._write(add_spans, encoded)

    async def add_packed_spans(self, spans: Sequence[Span], packed: Sequence[Optional[bytes]]) -> Sequence[Span]:
        """`add_many_spans` for spans whose token arrays the client packed already.

        `packed[i]` is span i's blob (`tokens.pack_attributes`) or None; the span's
        attributes hold `null` where the blob's arrays go. Each blob is checked against
        its span before anything is stored. Returns the stored spans as sent (token arrays
        still `null`) with their sequence ids: the HTTP server only reports positions.
        """
        check_packed_batch([span.attributes for span in spans], packed)
        encoded = [_encode_span(span, index, blob) for index, (span, blob) in enumerate(zip(spans, packed))]
        if not encoded:
            return []
        return await self._write(add_spans, encoded)

    async def add_otel_span(
        self,
        rollout_id: str,
        attempt_id: str,
        readable_span: Any,
        sequence_id: int | None = None,
    ) -> Optional[Span]:
        return await self.add_span(span_from_otel(readable_span, rollout_id, attempt_id, sequence_id))

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        return (await self._write(issue_sequence_ids, [(rollout_id, attempt_id)]))[0]

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[Tuple[str, str]]) -> Sequence[int]:
        pairs = [(str(rollout_id), str(attempt_id)) for rollout_id, attempt_id in rollout_attempt_ids]
        if not pairs:
            return []
        return await self._write(issue_sequence_ids, pairs)

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
        _decode: Callable[[Sequence[Any]], Any] = span_from_row,
    ) -> Sequence[Span]:
        # `_decode` is for `query_span_rows` only: callers of the contract get Spans.
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
        query = _paged(
            select=f"SELECT {SPAN_COLUMNS} FROM spans",
            count="SELECT count(*) FROM spans",
            where=must + (" AND (" + optional[len(" WHERE ") :] + ")" if optional else ""),
            params=[rollout_id, *([attempt_id] if attempt_id is not None else []), *where.params],
            order=_order_by(None, sort_by, SPAN_SORT_FIELDS, sort_order, default="pk"),
            limit=limit,
            offset=offset,
        )
        return await self._call(read_span_page, query, attempt_id == "latest", _decode)

    async def query_span_rows(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        decode: Callable[[Sequence[Any]], T],
        **filters: Any,
    ) -> Page[T]:
        """`query_spans` (same filters) with each stored row (`SPAN_COLUMNS`) through `decode`
        instead of into a Span: the HTTP server writes rows straight to JSON (`span_wire`)."""
        return await self.query_spans(rollout_id, attempt_id, _decode=decode, **filters)  # type: ignore[return-value]

    # --- resources -------------------------------------------------------------------------

    async def add_resources(self, resources: NamedResources) -> ResourcesUpdate:
        return await self._write(put_resources, new_id("rs"), _encode_resources(resources), False)

    async def update_resources(self, resources_id: str, resources: NamedResources) -> ResourcesUpdate:
        if not isinstance(resources_id, str) or not resources_id:
            raise InvalidInputError(f"resources_id must be a non-empty string, got {resources_id!r}")
        return await self._write(put_resources, resources_id, _encode_resources(resources), True)

    async def get_resources_by_id(self, resources_id: str) -> Optional[ResourcesUpdate]:
        return await self._call(get_resources, resources_id)

    async def get_latest_resources(self) -> Optional[ResourcesUpdate]:
        return await self._call(get_resources, None)

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
        query = _paged(
            select=f"SELECT {RESOURCES_COLUMNS} FROM resources",
            count="SELECT count(*) FROM resources",
            where=where.sql("and"),
            params=where.params,
            order=_order_by(None, sort_by, RESOURCES_SORT_FIELDS, sort_order, default="rowid"),
            limit=limit,
            offset=offset,
        )
        return await self._call(queries.run_paged, query, resources_from_row)

    # --- workers ---------------------------------------------------------------------------

    async def update_worker(self, worker_id: str, heartbeat_stats: Dict[str, Any] = UNSET) -> Worker:
        if not isinstance(worker_id, str) or not worker_id:
            raise InvalidInputError(f"worker_id must be a non-empty string, got {worker_id!r}")
        stats = (
            UNSET
            if heartbeat_stats is UNSET
            else _dumps(_check_metadata(heartbeat_stats, "heartbeat_stats"), "heartbeat_stats")
        )
        return await self._write(workers.heartbeat_worker, worker_id, stats)

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
            statuses = [check_worker_status(s, "status_in") for s in _as_list(status_in, "status_in")]
            where.add("status IN (SELECT value FROM json_each(?))", orjson.dumps(statuses))
        if worker_id_contains is not None:
            where.add("instr(worker_id, ?) > 0", worker_id_contains)
        query = _paged(
            select=f"SELECT {WORKER_COLUMNS} FROM workers",
            count="SELECT count(*) FROM workers",
            where=where.sql(_check_logic(filter_logic)),
            params=where.params,
            order=_order_by(None, sort_by, WORKER_SORT_FIELDS, sort_order, default="rowid"),
            limit=limit,
            offset=offset,
        )
        return await self._call(queries.run_paged, query, worker_from_row)

    async def get_worker_by_id(self, worker_id: str) -> Optional[Worker]:
        return await self._call(workers.get_worker, worker_id)

    # --- retention -------------------------------------------------------------------------

    # Retention deletes in transactions of at most `retention_chunk_spans` spans, queued with
    # the other writes, so calls made meanwhile wait for one chunk, not for the whole deletion
    # (and reads do not wait at all). Then the freed pages go back to the file system, in
    # steps as bounded, and the WAL, which holds a copy of every page a step wrote, is
    # truncated to zero bytes.

    async def delete_rollouts(self, rollout_ids: Sequence[str]) -> int:
        ids = list(dict.fromkeys(_as_list(rollout_ids, "rollout_ids")))
        if not ids:
            return 0
        remaining = await self._call(retention.finished_rollouts, ids)
        if not remaining:
            return 0
        deleted = 0
        while remaining:
            done, removed = await self._write(retention.delete_finished, remaining, self.retention_chunk_spans)
            remaining = remaining[done:]
            deleted += removed
        await self._reclaim_space()
        return deleted

    async def expire_rollouts(self, older_than_seconds: float) -> int:
        _check_number(older_than_seconds, "older_than_seconds")
        if older_than_seconds < 0:
            raise InvalidInputError(f"older_than_seconds must be >= 0, got {older_than_seconds}")
        ended_before = time.time() - older_than_seconds
        if not await self._call(retention.any_expired, ended_before):
            return 0  # the common call: one index lookup, no write lock
        expired, more = 0, True
        while more:
            removed, more = await self._write(retention.expire_finished, ended_before, self.retention_chunk_spans)
            expired += removed
        await self._reclaim_space()
        return expired

    async def _reclaim_space(self) -> None:
        # Users ran out of disk with stores that only grew: give freed pages back.
        if self.in_memory:
            return
        while await self._run(retention.reclaim_space, RECLAIM_PAGES_PER_STEP):
            pass
        wait_ms, busy_ms = int(WAL_TRUNCATE_WAIT_S * 1000), int(self.busy_timeout * 1000)
        if not await self._run(retention.truncate_wal, wait_ms, busy_ms):
            logger.info("store %s: readers kept the WAL from being truncated after retention", self.path)


def _file_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _store_error(exc: BaseException) -> BaseException:
    """SQLite's own errors become StoreError (a 500); the store's errors pass through."""
    if isinstance(exc, sqlite3.Error):
        error = StoreError(f"SQLite error: {exc}")
        error.__cause__ = exc
        return error
    return exc


# === validation (event loop side, before any transaction) ===================================


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(value: Any, field: str) -> bytes:
    check_json_depth(value, field)
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
    try:
        return float(value)
    except OverflowError:  # an int past the largest double
        raise InvalidInputError(f"{field} is out of range, got {value!r}") from None


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
    _check_sort(sort_by, allowed, sort_order)
    direction = sort_order.upper()
    if sort_by is None:
        return f" ORDER BY {default} {direction}"
    prefix = f"{table}." if table else ""
    # The default order breaks ties, so pages are stable.
    return f" ORDER BY {prefix}{sort_by} {direction}, {default} {direction}"


def _check_sort(sort_by: Optional[str], allowed: frozenset[str], sort_order: Any) -> None:
    if sort_order not in ("asc", "desc"):
        raise InvalidInputError(f"sort_order must be 'asc' or 'desc', got {sort_order!r}")
    if sort_by is not None and sort_by not in allowed:
        raise invalid_sort_by(sort_by, sorted(allowed))


def _paged(**parts: Any) -> queries.PagedQuery:
    _check_paging(parts["limit"], parts["offset"])
    return queries.PagedQuery(**parts)


def _check_paging(limit: Any, offset: Any) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < -1:
        raise InvalidInputError(f"limit must be -1 (no limit) or an int >= 0, got {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidInputError(f"offset must be an int >= 0, got {offset!r}")
    check_integer(limit, "limit")
    check_integer(offset, "offset")


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


def _new_rollout(input: Any, mode: Any, resources_id: Optional[str], config: Any, metadata: Any) -> queue.NewRollout:
    rollout = Rollout(
        rollout_id=new_id("ro"),
        input=input,
        start_time=time.time(),
        mode=_check_mode(mode),
        resources_id=resources_id,
        status="queuing",
        config=RolloutConfig() if config is None else _check_config(config).model_copy(deep=True),
        metadata=dict(_check_metadata(metadata) or {}),
    )
    return queue.NewRollout(
        rollout,
        _dumps(rollout.input, "input"),
        orjson.dumps(rollout.config.model_dump()),
        _dumps(rollout.metadata, "metadata"),
    )


def _encode_span(span: Any, index: int, packed: Optional[bytes] = None) -> EncodedSpan:
    if not isinstance(span, Span):
        span = _validate(Span, span, f"spans[{index}]")
    # 0 is agent-lightning 0.3's "no particular order" (its `Span.from_attributes` default).
    if span.sequence_id is not None and (isinstance(span.sequence_id, bool) or span.sequence_id < 0):
        raise InvalidInputError(f"spans[{index}].sequence_id must be >= 0, got {span.sequence_id!r}")
    if span.sequence_id is not None:
        check_integer(span.sequence_id, f"spans[{index}].sequence_id")
    # Token-bearing attributes get their depth checked on the packing walk (span_to_row).
    check_field_depths(span, f"spans[{index}]", skip="attributes" if packed is None else "")
    try:
        return EncodedSpan(span, span_to_row(span, span.sequence_id, packed))
    except TypeError as exc:
        raise InvalidInputError(f"spans[{index}] is not JSON: {exc}") from exc
    except InvalidInputError as exc:
        raise InvalidInputError(f"spans[{index}].{exc.message}") from None


def _encode_resources(resources: Any) -> Tuple[NamedResources, bytes]:
    try:
        validated = _RESOURCES.validate_python(resources)
    except ValidationError as exc:
        raise InvalidInputError(f"resources: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}") from exc
    check_json_depth(validated, "resources")
    try:
        return validated, _RESOURCES.dump_json(validated)
    except PydanticSerializationError as exc:
        raise InvalidInputError(f"resources are not JSON: {exc}") from exc
