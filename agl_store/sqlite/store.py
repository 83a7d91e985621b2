"""SQLiteStore: the embedded LightningStore, on a SQLite file or in memory (`:memory:`).

Each operation is one plain function of this package's modules (`queue`, `attempts`, `spans`,
`workers`, `resources`, `retention`, ...), run whole on a connection's own thread (`threads`):
one thread hop per call instead of one per statement. Writes go to the one writer connection,
whose thread runs one function at a time, so the store's writes are serialised (`writer`
groups concurrent ones into one commit). Every write runs inside `transactions.atomic()`
(`BEGIN IMMEDIATE`), which also serialises writers across processes sharing the file, so
sequence numbers and dequeues stay unique without any lock of our own. Reads of a file run on
separate reader connections, each in one snapshot: WAL lets them proceed while a write (a long
retention chunk, another process's transaction) is in progress. An in-memory database exists
only in its one connection, so there reads share the writer's.

This module is the async face: lifecycle, waiting, and the watchdog task. Input is checked
(`checks`, `select`) before any transaction, so bad input never takes the write lock. A
background task started by `open()` marks timed-out and unresponsive attempts; it is a
conditional write, so several processes running it at once is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from ..base import UNSET, LightningStore
from ..bounds import check_integer
from ..errors import InvalidInputError, StoreClosedError
from ..models import (
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
    new_id,
)
from ..otel import span_from_otel
from ..packed_attributes import check_packed_batch
from ..pages import Page
from ..queries import AttemptQuery, ResourcesQuery, RolloutQuery, SpanQuery, WorkerQuery
from ..transitions import check_attempt_status, check_rollout_mode, check_rollout_status
from . import attempts, queue, retention, statistics, transactions, watchdog, workers
from .checks import (
    as_list,
    check_config,
    check_metadata,
    check_metadata_match,
    check_number,
    dumps,
    encode_resources,
    encode_span,
    new_rollout,
    validate,
)
from .delta_index import DeltaIndex
from .delta_reads import compact, keep_attributes, materialise
from .paged import run_paged
from .resources import get_resources, put_resources
from .rollout_pages import read_rollout_page
from .rollouts import get_rollout, get_rollouts, rollout_statuses
from .schema import (
    apply_migrations,
    attempt_from_row,
    config_columns,
    configure_connection,
    configure_reader,
    resources_from_row,
    span_from_row,
    worker_from_row,
)
from .select import select_attempts, select_resources, select_rollouts, select_spans, select_workers
from .spans import add_spans, issue_sequence_ids
from .threads import ConnectionThread, ReaderPool
from .writer import WriteBatcher, store_error

__all__ = ["SQLiteStore"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

RECLAIM_PAGES_PER_STEP = 2048
"""Free pages one transaction gives back to the file system after retention (8 MB of 4 KB pages)."""
WAL_TRUNCATE_WAIT_S = 2.0
"""How long truncating the WAL after retention waits for readers of older snapshots."""


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
        deltas: store an LLM call that extends an earlier call of its attempt as a delta of
            it (`agl_store.sqlite.deltas`); readers see whole spans either way. False stores
            every span whole (for comparing; a database may hold both kinds).
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
        deltas: bool = True,
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
        self._deltas = DeltaIndex() if deltas else None
        self._writer: ConnectionThread | None = None
        self._readers: ReaderPool | None = None
        self._closed = False
        self._watchdog: asyncio.Task[None] | None = None
        self._writes = WriteBatcher(self._submit, self._wake_waiters)
        self._finished_event: asyncio.Event | None = None
        self._opened_at = time.time()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._writer is not None else "new"
        return f"SQLiteStore({self.path!r}, {state})"

    # --- lifecycle -----------------------------------------------------------------------

    async def open(self) -> SQLiteStore:
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
        readers: list[ConnectionThread] = []
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

    async def __aenter__(self) -> SQLiteStore:
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
        # Writes accepted before close() still commit; later ones get StoreClosedError.
        await self._writes.drain()
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
            raise store_error(exc) from exc

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
            raise store_error(exc) from exc

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], done: Callable[[Any, bool], None]) -> None:
        """Queue `fn(conn, *args)` on the writer connection's thread; `done(outcome, failed)`
        follows on the event loop (the write batcher's way in)."""
        # Without the open check, as `_run`: accepted writes still go during close().
        assert self._writer is not None
        self._writer.submit(fn, args, done)

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(txn, *args)` as one transaction (batched with concurrent writes); returns once
        it is committed."""
        self._check_open()
        return await self._writes.write(fn, *args)

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
        files: dict[str, Any] = {"database_bytes": None, "wal_bytes": None, "unused_bytes": None}
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
        metadata: dict[str, Any] | None = None,
        worker_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> AttemptedRollout:
        new = new_rollout(input, mode, resources_id, config, metadata, idempotency_key)
        return await self._write(queue.start_rollout, new, worker_id)

    async def enqueue_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Rollout:
        new = new_rollout(input, mode, resources_id, config, metadata, idempotency_key)
        return (await self._write(queue.enqueue_rollouts, [new]))[0]

    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> Sequence[Rollout]:
        news = []
        for index, request in enumerate(rollouts):
            if isinstance(request, dict):
                request = validate(EnqueueRolloutRequest, request, f"rollouts[{index}]")
            news.append(
                new_rollout(
                    request.input,
                    request.mode,
                    request.resources_id,
                    request.config,
                    request.metadata,
                    request.idempotency_key,
                    f"rollouts[{index}].idempotency_key",
                )
            )
        if not news:
            return []
        return await self._write(queue.enqueue_rollouts, news)

    async def dequeue_rollout(
        self, worker_id: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> AttemptedRollout | None:
        claimed = await self._write(queue.dequeue, 1, worker_id, check_metadata_match(metadata))
        return claimed[0] if claimed else None

    async def dequeue_many_rollouts(
        self, *, limit: int = 1, worker_id: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> Sequence[AttemptedRollout]:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidInputError(f"limit must be an int >= 0, got {limit!r}")
        match = check_metadata_match(metadata)
        if check_integer(limit, "limit") == 0:
            return []
        return await self._write(queue.dequeue, limit, worker_id, match)

    async def start_attempt(self, rollout_id: str, worker_id: str | None = None) -> AttemptedRollout:
        return await self._write(queue.start_attempt, rollout_id, worker_id)

    async def update_rollout(
        self,
        rollout_id: str,
        input: TaskInput = UNSET,
        mode: RolloutMode | None = UNSET,
        resources_id: str | None = UNSET,
        status: RolloutStatus = UNSET,
        config: RolloutConfig = UNSET,
        metadata: dict[str, Any] | None = UNSET,
    ) -> Rollout:
        columns: dict[str, Any] = {}
        if input is not UNSET:
            columns["input"] = dumps(input, "input")
        if mode is not UNSET:
            columns["mode"] = check_rollout_mode(mode)
        if resources_id is not UNSET:
            columns["resources_id"] = resources_id
        if config is not UNSET:
            columns.update(config_columns(check_config(config)))
        if metadata is not UNSET:
            columns["metadata"] = dumps(check_metadata(metadata), "metadata")
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
        metadata: dict[str, Any] = UNSET,
    ) -> Attempt:
        if status is not UNSET:
            check_attempt_status(status)
        if last_heartbeat_time is not UNSET:
            check_number(last_heartbeat_time, "last_heartbeat_time")
        # An attempt's worker and metadata are replaced, never cleared (agent-lightning 0.3's server says so too).
        for field, value in (("worker_id", worker_id), ("metadata", metadata)):
            if value is None:
                raise InvalidInputError(f"{field} is invalid; it cannot be a null value.")
        metadata_json = None if metadata is UNSET else dumps(check_metadata(metadata), "metadata")
        changes = attempts.AttemptChanges(status, worker_id, last_heartbeat_time, metadata, metadata_json)
        return await self._write(attempts.update_attempt, rollout_id, attempt_id, changes)

    async def get_rollout_by_id(self, rollout_id: str) -> Rollout | None:
        return await self._call(get_rollout, rollout_id)

    async def get_latest_attempt(self, rollout_id: str) -> Attempt | None:
        return await self._call(attempts.get_latest_attempt, rollout_id)

    async def find_rollouts(self, query: RolloutQuery) -> Page[Rollout]:
        return await self._call(read_rollout_page, select_rollouts(query))

    async def find_attempts(self, rollout_id: str, query: AttemptQuery) -> Page[Attempt]:
        return await self._call(run_paged, select_attempts(rollout_id, query), attempt_from_row)

    async def wait_for_rollouts(self, *, rollout_ids: list[str], timeout: float | None = None) -> list[Rollout]:
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise InvalidInputError(f"timeout must be None or a number >= 0, got {timeout!r}")
        ids = list(dict.fromkeys(as_list(rollout_ids, "rollout_ids")))
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

    async def add_span(self, span: Span) -> Span | None:
        stored = await self._write(add_spans, [encode_span(span, 0)], self._deltas)
        return stored[0] if stored else None

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        encoded = [encode_span(span, index) for index, span in enumerate(spans)]
        if not encoded:
            return []
        return await self._write(add_spans, encoded, self._deltas)

    async def add_packed_spans(self, spans: Sequence[Span], packed: Sequence[bytes | None]) -> Sequence[Span]:
        """Stores the checked blobs as they came, never unpacking them. Returns the stored
        spans as sent (token arrays still `null`) with their sequence ids: the HTTP server
        only reports positions."""
        check_packed_batch([span.attributes for span in spans], packed)
        encoded = [
            encode_span(span, index, blob) for index, (span, blob) in enumerate(zip(spans, packed, strict=False))
        ]
        if not encoded:
            return []
        return await self._write(add_spans, encoded, self._deltas)

    async def add_otel_span(
        self,
        rollout_id: str,
        attempt_id: str,
        readable_span: Any,
        sequence_id: int | None = None,
    ) -> Span | None:
        return await self.add_span(span_from_otel(readable_span, rollout_id, attempt_id, sequence_id))

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        return (await self._write(issue_sequence_ids, [(rollout_id, attempt_id)]))[0]

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[tuple[str, str]]) -> Sequence[int]:
        pairs = [(str(rollout_id), str(attempt_id)) for rollout_id, attempt_id in rollout_attempt_ids]
        if not pairs:
            return []
        return await self._write(issue_sequence_ids, pairs)

    async def find_spans(self, query: SpanQuery) -> Page[Span]:
        return await self.find_span_rows(query, span_from_row)

    async def find_span_rows(self, query: SpanQuery, decode: Callable[[Sequence[Any]], T]) -> Page[T]:
        whole = compact if query.compact else materialise
        if query.attributes is None:
            return await self._call(run_paged, select_spans(query), decode, whole)
        keys = frozenset(as_list(query.attributes, "attributes"))
        if not all(isinstance(key, str) for key in keys):
            raise InvalidInputError("attributes must be a list of attribute names (strings)")

        def complete(conn: sqlite3.Connection, rows: list[Any]) -> list[Any]:
            return keep_attributes(conn, whole(conn, rows), keys)

        return await self._call(run_paged, select_spans(query), decode, complete)

    # --- resources -------------------------------------------------------------------------

    async def add_resources(self, resources: NamedResources) -> ResourcesUpdate:
        return await self._write(put_resources, new_id("rs"), encode_resources(resources), False)

    async def update_resources(self, resources_id: str, resources: NamedResources) -> ResourcesUpdate:
        if not isinstance(resources_id, str) or not resources_id:
            raise InvalidInputError(f"resources_id must be a non-empty string, got {resources_id!r}")
        return await self._write(put_resources, resources_id, encode_resources(resources), True)

    async def get_resources_by_id(self, resources_id: str) -> ResourcesUpdate | None:
        return await self._call(get_resources, resources_id)

    async def get_latest_resources(self) -> ResourcesUpdate | None:
        return await self._call(get_resources, None)

    async def find_resources(self, query: ResourcesQuery) -> Page[ResourcesUpdate]:
        return await self._call(run_paged, select_resources(query), resources_from_row)

    # --- workers ---------------------------------------------------------------------------

    async def update_worker(self, worker_id: str, heartbeat_stats: dict[str, Any] = UNSET) -> Worker:
        if not isinstance(worker_id, str) or not worker_id:
            raise InvalidInputError(f"worker_id must be a non-empty string, got {worker_id!r}")
        stats = (
            UNSET
            if heartbeat_stats is UNSET
            else dumps(check_metadata(heartbeat_stats, "heartbeat_stats"), "heartbeat_stats")
        )
        return await self._write(workers.heartbeat_worker, worker_id, stats)

    async def find_workers(self, query: WorkerQuery) -> Page[Worker]:
        return await self._call(run_paged, select_workers(query), worker_from_row)

    async def get_worker_by_id(self, worker_id: str) -> Worker | None:
        return await self._call(workers.get_worker, worker_id)

    # --- retention -------------------------------------------------------------------------

    # Retention deletes in transactions of at most `retention_chunk_spans` spans, queued with
    # the other writes, so calls made meanwhile wait for one chunk, not for the whole deletion
    # (and reads do not wait at all). Then the freed pages go back to the file system, in
    # steps as bounded, and the WAL, which holds a copy of every page a step wrote, is
    # truncated to zero bytes.

    async def delete_rollouts(self, rollout_ids: Sequence[str]) -> int:
        ids = list(dict.fromkeys(as_list(rollout_ids, "rollout_ids")))
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
        check_number(older_than_seconds, "older_than_seconds")
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
