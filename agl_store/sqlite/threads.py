"""SQLite connections for asyncio: each one owned by one thread that runs whole functions on it.

A `ConnectionThread` runs `fn(conn, *args)` on its connection's own thread, so an operation
of many statements costs one thread hop and no other coroutine can interleave with it.
`sqlite3` releases the GIL while SQLite works, so connections on different threads (a
writer and WAL readers) make progress at the same time. (aiosqlite works the same way but
offers no public call to run a function on its thread.)
"""

from __future__ import annotations

import asyncio
import functools
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..errors import StoreClosedError

T = TypeVar("T")

_Done = Callable[[Any, bool], None]
"""Called on the event loop with (outcome, failed): the function's value, or what it raised."""
_Job = tuple[asyncio.AbstractEventLoop, _Done, Callable[..., Any], tuple[Any, ...]]


class ConnectionThread:
    """One sqlite3 connection, opened, used and closed on one dedicated thread."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        # A daemon: a store never closed must not keep the interpreter from exiting.
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    @classmethod
    async def open(cls, path: str, name: str, setup: Callable[[sqlite3.Connection], Any]) -> ConnectionThread:
        """Connect to `path` in autocommit mode (every transaction explicit) and run `setup` on it."""
        opened = cls(name)
        opened._thread.start()
        try:
            await opened.run(lambda _no_connection_yet: opened._connect(path))
            await opened.run(setup)
        except BaseException:
            await opened.close()
            raise
        return opened

    def _connect(self, path: str) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, cached_statements=256)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, done, fn, args = job
            try:
                outcome, failed = fn(self._conn, *args), False
            except BaseException as exc:  # handed to the caller, whatever it is
                outcome, failed = exc, True
            try:
                loop.call_soon_threadsafe(done, outcome, failed)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass
        if self._conn is not None:
            self._conn.close()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` on this connection's thread. Functions run one at a time, in call order."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.submit(fn, args, functools.partial(_settle, future))
        return await future

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], done: _Done) -> None:
        """Queue `fn(conn, *args)` (after the functions already queued); `done(outcome, failed)`
        is then called on the caller's event loop. No future or task of its own: for callers
        that settle many futures at once (`writer.WriteBatcher`)."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        self._jobs.put((asyncio.get_running_loop(), done, fn, args))

    async def close(self) -> None:
        """Close the connection after the functions already submitted. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)


def _settle(future: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
    if future.cancelled():  # the caller gave up waiting; the function ran anyway
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class ReaderPool:
    """Connections that serve reads, each call taking whichever one is free."""

    def __init__(self, readers: Sequence[ConnectionThread]) -> None:
        self._readers: list[ConnectionThread] = list(readers)
        self._idle: asyncio.Queue[ConnectionThread] = asyncio.Queue()
        for reader in self._readers:
            self._idle.put_nowait(reader)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        reader = await self._idle.get()
        try:
            return await reader.run(fn, *args)
        finally:
            # Even when the caller was cancelled: the reader's thread finishes `fn` before the
            # next function it is given.
            self._idle.put_nowait(reader)

    async def close(self) -> None:
        """Close every connection once the reads in flight have returned it."""
        for _ in self._readers:
            reader = await self._idle.get()
            await reader.close()
