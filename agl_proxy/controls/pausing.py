"""Pause and drain: the trainer stops new calls around a weight update.

While paused, new calls are held: they wait (up to `hold_s` from their arrival, or the bound the
pause itself gave) and go on
when the proxy resumes, so an agent sees a slow call rather than an error. Past the bound
they are refused with 429 and `Retry-After`. Calls already in flight run to completion,
and `wait_drained()` returns once none is left; `cancel_in_flight()` cuts those still
running when the trainer will not wait longer.

A pause may also ask the calls in flight to stop generating (`pause(..., stop_generations=True)`):
a call that can continue its generation later (the token chain's, `CallHandle.stop`) stops it,
keeps what it sampled and parks (`CallHandle.park`) until the resume, and counts as drained
meanwhile; the others are drained or cancelled as above.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..common.errors import PausedError, short_text
from ..common.metrics import Histogram

DEFAULT_RETRY_AFTER_S = 5
DEFAULT_HOLD_S = 600.0
"""How long a call that arrives during a pause waits for the resume before its 429."""
HOLD_BUCKETS_S: tuple[float, ...] = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class CallHandle:
    """One admitted call, which the gate can cancel (a weight update that will not wait) or ask
    to stop generating (`stop`) and park until the resume."""

    def __init__(self, task: asyncio.Task[Any] | None, gate: PauseGate) -> None:
        self._task = task
        self._gate = gate
        self.cancelled = False
        self.parked = 0
        """How many of the call's generations are parked (one per choice that streams on its own)."""
        self.stop = asyncio.Event()
        """Set while a pause asks the calls in flight to stop generating; cleared by the resume."""

    async def park(self) -> None:
        """Wait, counted as drained, until the proxy resumes; raises PausedError past the pause's
        hold bound (the client then gets the error, the call its span)."""
        await self._gate.park(self)

    def continued(self, tokens_kept: int) -> None:
        """Count a generation continued after the resume with `tokens_kept` ids sampled before it."""
        self._gate.continued_calls += 1
        self._gate.continued_tokens_kept += tokens_kept

    def cancel(self) -> bool:
        if self._task is None or self._task.done():
            return False
        self.cancelled = True
        self._task.cancel()
        return True


class PauseGate:
    """Counts calls in flight, holds new ones while paused, refuses them past the hold bound."""

    def __init__(self, retry_after_s: int = DEFAULT_RETRY_AFTER_S, hold_s: float = DEFAULT_HOLD_S) -> None:
        self.retry_after_s = retry_after_s
        self.hold_s = hold_s
        self.paused = False
        self.reason: str | None = None
        self.paused_at: float | None = None
        self.pause_hold_s: float | None = None
        """The current pause's own hold bound (the trainer's pause for an update), else `hold_s`."""
        self.in_flight = 0
        self.held = 0
        self.refused_after_hold = 0
        """Calls answered 429 because the pause outlasted `hold_s`."""
        self.left_while_held = 0
        """Calls whose client went away while held."""
        self.hold_time = Histogram(HOLD_BUCKETS_S)
        self.cancelled_calls = 0
        self.parked = 0
        """Calls parked until the resume, their generation stopped."""
        self.continued_calls = 0
        self.continued_tokens_kept = 0
        """Ids sampled before an update that continued calls kept (not generated again)."""
        self._calls: set[CallHandle] = set()
        self._drained: asyncio.Event | None = None
        self._resumed: asyncio.Event | None = None
        """Set by the resume; one per pause, made in the loop that serves it."""

    async def enter(self, client_gone: Callable[[], Awaitable[Any]] | None = None) -> CallHandle | None:
        """Admit a call and return its handle; while paused, hold it until the resume first.

        `client_gone` is awaited while the call is held and returns when the client
        disconnects; the call is then dropped and None returned. Raises PausedError when
        the pause outlasts `hold_s`.
        """
        if self.paused:
            if not await self._hold(client_gone):
                return None
        self.in_flight += 1
        handle = CallHandle(asyncio.current_task(), self)
        self._calls.add(handle)
        return handle

    async def _hold(self, client_gone: Callable[[], Awaitable[Any]] | None) -> bool:
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.held += 1
        gone = asyncio.ensure_future(client_gone()) if client_gone is not None else None
        try:
            if await self._until_resumed(start, gone):
                return True
            self.left_while_held += 1
            return False
        except PausedError:
            self.refused_after_hold += 1
            raise
        finally:
            if gone is not None:
                gone.cancel()
            self.held -= 1
            self.hold_time.observe(loop.time() - start)

    async def _until_resumed(self, start: float, gone: asyncio.Future[Any] | None) -> bool:
        """Wait until the proxy resumes (True) or `gone` is done (False: the client left); PausedError
        once the pause outlasts its hold bound, counted from `start` (the loop's time)."""
        loop = asyncio.get_running_loop()
        # A loop: a new pause may begin between the resume and this call running again.
        while self.paused:
            # Read each time round: a later pause of the same hold may give a longer bound.
            hold_s = self.hold_s if self.pause_hold_s is None else self.pause_hold_s
            remaining = start + hold_s - loop.time()
            if remaining <= 0:
                raise self._refusal(f"the proxy stayed paused{self._why()} for more than {hold_s:g} s")
            assert self._resumed is not None
            resumed: asyncio.Future[Any] = asyncio.ensure_future(self._resumed.wait())
            waiting = {resumed} if gone is None else {resumed, gone}
            try:
                await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                resumed.cancel()
            if gone is not None and gone.done():
                return False
        return True

    def _why(self) -> str:
        return f" ({self.reason})" if self.reason else ""

    def _refusal(self, what: str) -> PausedError:
        return PausedError(
            f"{what}; retry after {self.retry_after_s} s", headers={"retry-after": str(self.retry_after_s)}
        )

    async def park(self, handle: CallHandle) -> None:
        """`CallHandle.park`: wait for the resume (the current pause's hold bound from now)."""
        start = asyncio.get_running_loop().time()
        handle.parked += 1
        if handle.parked == 1:
            self.parked += 1
            self._note_drained()
        try:
            await self._until_resumed(start, None)
        finally:
            handle.parked -= 1
            if handle.parked == 0:
                self.parked -= 1

    def exit(self, handle: CallHandle) -> None:
        self._calls.discard(handle)
        self.in_flight -= 1
        self._note_drained()

    @property
    def active(self) -> int:
        """Calls in flight and not parked: what a drain waits for."""
        return self.in_flight - self.parked

    def _note_drained(self) -> None:
        if self.active == 0 and self._drained is not None:
            self._drained.set()

    def pause(self, reason: str | None = None, hold_s: float | None = None, stop_generations: bool = False) -> None:
        """Hold new calls (up to `hold_s`, default the gate's own `hold_s`); `reason` (cut to 200
        characters) is repeated in every 429. `stop_generations`: the calls in flight that can
        continue their generation after the resume stop it and park."""
        if not self.paused:
            self._resumed = asyncio.Event()
        self.paused = True
        self.reason = short_text(reason) if reason else None
        self.paused_at = time.time()
        self.pause_hold_s = hold_s
        if stop_generations:
            for handle in self._calls:
                handle.stop.set()

    def resume(self) -> None:
        self.paused = False
        self.reason = None
        self.paused_at = None
        self.pause_hold_s = None
        for handle in self._calls:
            handle.stop.clear()
        if self._resumed is not None:
            self._resumed.set()

    async def wait_drained(self, timeout: float | None = None) -> bool:
        """Wait until no call is in flight but parked ones; False if `timeout` seconds passed first."""
        if self.active == 0:
            return True
        if self._drained is None:
            self._drained = asyncio.Event()
        self._drained.clear()
        try:
            await asyncio.wait_for(self._drained.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def cancel_in_flight(self) -> int:
        """Cancel every call in flight but parked ones (each answers its client 503); how many were cancelled."""
        cancelled = sum(handle.cancel() for handle in list(self._calls) if not handle.parked)
        self.cancelled_calls += cancelled
        return cancelled

    def state(self) -> dict[str, Any]:
        return {
            "paused": self.paused,
            "reason": self.reason,
            "paused_at": self.paused_at,
            "in_flight": self.in_flight,
            "held": self.held,
            "parked": self.parked,
        }
