"""Pause and drain: the trainer stops new calls around a weight update.

While paused, new calls are refused with 429 and `Retry-After`; calls already in flight
run to completion, and `wait_drained()` returns once none is left.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .errors import PausedError, short_text

DEFAULT_RETRY_AFTER_S = 5


class PauseGate:
    """Counts calls in flight and refuses new ones while paused."""

    def __init__(self, retry_after_s: int = DEFAULT_RETRY_AFTER_S) -> None:
        self.retry_after_s = retry_after_s
        self.paused = False
        self.reason: str | None = None
        self.paused_at: float | None = None
        self.in_flight = 0
        self._drained: asyncio.Event | None = None

    def enter(self) -> None:
        """Admit a call, or raise PausedError while paused."""
        if self.paused:
            why = f" ({self.reason})" if self.reason else ""
            raise PausedError(
                f"the proxy is paused{why}; retry after {self.retry_after_s} s",
                headers={"retry-after": str(self.retry_after_s)},
            )
        self.in_flight += 1

    def exit(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self._drained is not None:
            self._drained.set()

    def pause(self, reason: str | None = None) -> None:
        """Refuse new calls; `reason` (cut to 200 characters) is repeated in every 429."""
        self.paused = True
        self.reason = short_text(reason) if reason else None
        self.paused_at = time.time()

    def resume(self) -> None:
        self.paused = False
        self.reason = None
        self.paused_at = None

    async def wait_drained(self, timeout: float | None = None) -> bool:
        """Wait until no call is in flight; False if `timeout` seconds passed first."""
        if self.in_flight == 0:
            return True
        if self._drained is None:
            self._drained = asyncio.Event()
        self._drained.clear()
        try:
            await asyncio.wait_for(self._drained.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def state(self) -> dict[str, Any]:
        return {"paused": self.paused, "reason": self.reason, "paused_at": self.paused_at, "in_flight": self.in_flight}
