"""SQLite connections for asyncio: each one owned by one thread that runs whole functions on it.

A `ConnectionThread` runs `fn(conn, *args)` on its connection's own thread, so an operation
of many statements costs one thread hop and no other coroutine can interleave with it.
`sqlite3` releases the GIL while SQLite works, so connections on different threads (a
writer and WAL readers) make progress at the same time. Built on the standard library's
executors: aiosqlite offers no public way to run a function on its thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import sqlite3
from typing import Any, Callable, List, Sequence, TypeVar

from .errors import StoreClosedError

T = TypeVar("T")


class ConnectionThread:
    """One sqlite3 connection, opened, used and closed on one dedicated thread."""

    def __init__(self, executor: concurrent.futures.ThreadPoolExecutor, conn: sqlite3.Connection) -> None:
        self._executor = executor
        self._conn = conn
        self._closed = False

    @classmethod
    async def open(cls, path: str, name: str, setup: Callable[[sqlite3.Connection], Any]) -> "ConnectionThread":
        """Connect to `path` in autocommit mode (every transaction explicit) and run `setup` on it."""
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(
                executor, functools.partial(sqlite3.connect, path, isolation_level=None, cached_statements=256)
            )
        except BaseException:
            executor.shutdown(wait=False)
            raise
        opened = cls(executor, conn)
        try:
            await opened.run(setup)
        except BaseException:
            await opened.close()
            raise
        return opened

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` on this connection's thread. Functions run one at a time, in call order."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        call = functools.partial(fn, self._conn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def close(self) -> None:
        """Close the connection after the functions already submitted. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._conn.close)
        finally:
            self._executor.shutdown(wait=False)


class ReaderPool:
    """Connections that serve reads, each call taking whichever one is free."""

    def __init__(self, readers: Sequence[ConnectionThread]) -> None:
        self._readers: List[ConnectionThread] = list(readers)
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
