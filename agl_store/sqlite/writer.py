"""Write batching: concurrent writes grouped into one transaction on the writer connection.

Writes that arrive while another batch is committing are grouped into the next one: one
thread hop and one commit for many concurrent calls (say, 16 proxies' `add_span`), each in
its own savepoint so one call's error undoes only its own changes.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
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

    One batch at a time is on the writer's thread; writes that arrive meanwhile wait for it
    and go as the next batch, sent from the callback that settles the last one. No task or
    thread future per batch: a lone write costs one hop to the thread and one back.

    Args:
        submit: queues `fn(conn, *args)` on the writer connection's thread and has
            `done(outcome, failed)` called on the event loop after it
            (`threads.ConnectionThread.submit`).
        on_finished: called after a commit that finished rollouts (to wake their waiters).
    """

    def __init__(
        self,
        submit: Callable[[Callable[..., Any], tuple[Any, ...], Callable[[Any, bool], None]], None],
        on_finished: Callable[[], None],
    ) -> None:
        self._submit = submit
        self._on_finished = on_finished
        self._pending: list[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]] = []
        self._sent: list[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]] | None = None
        self._drained: asyncio.Future[None] | None = None

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(txn, *args)` as part of a transaction; returns once it is committed."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((fn, args, future))
        if self._sent is None:
            self._send()
        return await future

    async def drain(self) -> None:
        """Wait until every write accepted so far is committed (or failed)."""
        if self._sent is None:
            return
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._drained)

    def _send(self) -> None:
        """Send the next batch of pending writes to the writer's thread."""
        while self._pending:
            batch = self._pending[:MAX_WRITES_PER_COMMIT]
            del self._pending[:MAX_WRITES_PER_COMMIT]
            self._sent = batch
            try:
                self._submit(run_writes, ([(fn, args) for fn, args, _ in batch],), self._settle)
                return
            except BaseException as exc:  # not sent (the store is closed): nothing was written
                self._sent = None
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(store_error(exc))
        self._idle()

    def _settle(self, outcomes: Any, failed: bool) -> None:
        """The sent batch's outcomes (or what `run_writes` raised: then nothing of it was
        committed), on the event loop; then the next batch goes."""
        batch, self._sent = self._sent or [], None
        if failed:
            outcomes = [(False, outcomes, ())] * len(batch)
        finished = False
        for (_, _, future), (ok, value, finished_ids) in zip(batch, outcomes, strict=True):
            finished = finished or bool(finished_ids)
            if future.done():  # the caller was cancelled; the write stands
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(store_error(value))
        try:
            if finished:
                self._on_finished()
        finally:
            self._send()

    def _idle(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None
