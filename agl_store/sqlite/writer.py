"""Write batching: concurrent writes grouped into one transaction on the writer connection.

Writes that arrive while another batch is committing are grouped into the next one: one
thread hop and one commit for many concurrent calls (say, 16 proxies' `add_span`), each in
its own savepoint so one call's error undoes only its own changes.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import StoreError
from .transactions import run_writes

T = TypeVar("T")

MAX_WRITES_PER_COMMIT = 256
"""Concurrent writes grouped into one transaction at most; bounds a commit's size."""


def store_error(exc: BaseException) -> BaseException:
    """SQLite's own errors become StoreError (a 500); the store's errors pass through."""
    if isinstance(exc, sqlite3.Error):
        error = StoreError(f"SQLite error: {exc}")
        error.__cause__ = exc
        return error
    return exc


class WriteBatcher:
    """Queues write functions `fn(txn, *args)` and commits them in batches, in arrival order.

    Args:
        run: runs `fn(conn, *args)` on the writer connection's thread.
        on_finished: called after a commit that finished rollouts (to wake their waiters).
    """

    def __init__(self, run: Callable[..., Awaitable[Any]], on_finished: Callable[[], None]) -> None:
        self._run = run
        self._on_finished = on_finished
        self._pending: list[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(txn, *args)` as part of a transaction; returns once it is committed."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((fn, args, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def drain(self) -> None:
        """Wait until every write accepted so far is committed (or failed)."""
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)

    async def _flush(self) -> None:
        while self._pending:
            batch = self._pending[:MAX_WRITES_PER_COMMIT]
            del self._pending[:MAX_WRITES_PER_COMMIT]
            try:
                outcomes = await self._run(run_writes, [(fn, args) for fn, args, _ in batch])
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
                    future.set_exception(store_error(value))
            if finished:
                self._on_finished()
