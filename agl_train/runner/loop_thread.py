"""An asyncio event loop on its own thread, for the synchronous verl trainer.

verl's `fit()` is synchronous and calls helpers that run their own event loops, while the
rollout dispatcher must keep running between steps (async rollout). The trainer therefore
keeps agl's async side on one background loop and calls into it with `run(coro)`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """`start()`, then `run(coro)` from any other thread; `stop()` ends the loop."""

    def __init__(self, name: str = "agl-loop") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} is already running")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=self.name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (its exception is raised here)."""
        if self._loop is None:
            coro.close()
            raise RuntimeError(f"{self.name} is not running; call start() first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = None
        self._thread = None
