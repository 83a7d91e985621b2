"""Asynchronous, batched span export with a bounded backlog, backpressure and retries.

The agent's call does not wait for its span: a finished call is queued here and written
later with `add_many_spans`, in batches. When the store is slow or down, spans wait and
the batch is retried with capped backoff. No span of an answered call is given up for
lack of room: once `max_buffer` spans wait, new calls wait for room (`wait_for_room`, up to `backpressure_wait_s`) and
are refused with a 503 if none comes, so the backlog, and with it what a SIGKILL can
lose, stays about `max_buffer`. Only a span the store rejects (an attempt it does not
know) is left out, counted as rejected.

Sequence numbers must follow call order within a rollout, also across proxy processes,
so each call's number is reserved when the call starts (`sequences.SequenceReserver`,
concurrently with the backend call, adding no latency); the span is written with it
later. If that reservation fails (store down), the span is written without a number and
the store issues one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import deque

from agl_store.base import LightningStore
from agl_store.models import Span

from .call_record import CallRecord, build_llm_span
from .sequences import SequenceReserver, is_rejection

logger = logging.getLogger(__name__)

DEFAULT_MAX_BUFFER = 1024
DEFAULT_BATCH_SIZE = 256
DEFAULT_FLUSH_INTERVAL_S = 0.02
DEFAULT_STOP_STALL_S = 30.0
DEFAULT_BACKPRESSURE_WAIT_S = 5.0
RETRY_BASE_S = 0.2
RETRY_MAX_S = 5.0
# How long a batch waits for the sequence numbers of its calls before it lets the store
# number them.
SEQUENCE_WAIT_S = 5.0

# A call whose span is not built yet, or a span built for an earlier, failed write (kept
# as is so that a retry keeps its span id and sequence number).
_Item = tuple[CallRecord, "asyncio.Future[int] | None"] | Span


class SpanExporter:
    """Writes call spans to a `LightningStore` in the background.

    `start()` inside a running loop; from request handlers `wait_for_room()` before a call,
    `reserve_sequence()` at its start and `submit()` at its end (neither blocks); `stop()`
    to write what is left.
    """

    def __init__(
        self,
        store: LightningStore | None,
        *,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        backpressure_wait_s: float = DEFAULT_BACKPRESSURE_WAIT_S,
        batch_size: int = DEFAULT_BATCH_SIZE,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
    ) -> None:
        if max_buffer < 1:
            raise ValueError(f"max_buffer must be >= 1, got {max_buffer}")
        if not math.isfinite(backpressure_wait_s) or backpressure_wait_s < 0:
            raise ValueError(f"backpressure_wait_s must be a finite number >= 0, got {backpressure_wait_s!r}")
        self.store = store
        self.max_buffer = max_buffer
        self.backpressure_wait_s = backpressure_wait_s
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.exported = 0
        self.rejected = 0
        self.failed_attempts = 0
        self.waited_calls = 0
        self.refused_calls = 0
        self._buffer: deque[_Item] = deque()
        self._writing = 0
        self._sequences = SequenceReserver(store) if store is not None else None
        self._wakeup: asyncio.Event | None = None
        self._room: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.Event | None = None

    @property
    def buffered(self) -> int:
        """Spans not written yet: waiting, or in the batch being written."""
        return len(self._buffer) + self._writing

    def reserve_sequence(self, rollout_id: str, attempt_id: str) -> asyncio.Future[int] | None:
        """Ask the store for the call's sequence number now; None for calls without a rollout."""
        if self._sequences is None or not rollout_id or not attempt_id:
            return None
        return self._sequences.reserve(rollout_id, attempt_id)

    async def wait_for_room(self) -> bool:
        """True at once while fewer than `max_buffer` spans wait; else waits up to `backpressure_wait_s`
        for the backlog to shrink, False if it did not (the caller refuses the call).

        Calls already admitted always queue their span, so the backlog can pass `max_buffer`
        by the calls in flight when it filled: the bound is soft, nothing is ever dropped.
        """
        if self._room is None or self._room.is_set():
            return True
        self.waited_calls += 1
        try:
            await asyncio.wait_for(self._room.wait(), self.backpressure_wait_s)
        except TimeoutError:
            self.refused_calls += 1
            return False
        return True

    def submit(self, record: CallRecord, sequence: asyncio.Future[int] | None = None) -> None:
        """Queue a finished call's span; never drops one, never blocks."""
        if self.store is None:
            if sequence is not None:
                sequence.cancel()
            return
        self._buffer.append((record, sequence))
        self._update_room()
        if self._wakeup is not None and self._idle is not None:
            # Not idle from now on, so that `flush()` waits for this span, not only for the batch in flight.
            self._idle.clear()
            self._wakeup.set()

    def _update_room(self) -> None:
        if self._room is None:
            return
        if self.buffered < self.max_buffer:
            self._room.set()
        else:
            self._room.clear()

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._room = asyncio.Event()
        self._update_room()
        self._task = asyncio.create_task(self._run(), name="agl-proxy-span-exporter")

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted span is written; False if `timeout` passed first."""
        if self._task is None or self._idle is None:
            return not self._buffer
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def stop(self, stall_timeout: float = DEFAULT_STOP_STALL_S) -> None:
        """Write every span left, for as long as the store keeps accepting them: give up
        only after `stall_timeout` seconds in which it accepted none (store unreachable)."""
        if self._task is None:
            return
        written = self.exported
        while not await self.flush(stall_timeout) and self.exported > written:
            written = self.exported
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self._task = None
        if self._sequences is not None:
            await self._sequences.close()
        if self._buffer:
            logger.error(
                "agl_proxy stopped with %d span(s) unwritten: the store accepted none for %g s",
                len(self._buffer),
                stall_timeout,
            )

    async def _run(self) -> None:
        assert self._wakeup is not None and self._idle is not None
        backoff = RETRY_BASE_S
        while True:
            if not self._buffer:
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                # A short pause lets calls finishing together share one batch.
                await asyncio.sleep(self.flush_interval_s)
            self._idle.clear()
            batch = [self._buffer.popleft() for _ in range(min(self.batch_size, len(self._buffer)))]
            self._writing = len(batch)
            try:
                spans = await self._build(batch)
            except asyncio.CancelledError:
                self._writing = 0
                self._buffer.extendleft(reversed(batch))
                raise
            try:
                await self._write(spans)
                backoff = RETRY_BASE_S
            except asyncio.CancelledError:
                self._buffer.extendleft(reversed(spans))
                raise
            except Exception as exc:  # store down or failing: keep the spans, retry later
                remaining = exc.remaining if isinstance(exc, _PartialWrite) else spans
                self.failed_attempts += 1
                logger.warning(
                    "agl_proxy could not export %d span(s), retrying in %.1f s: %r", len(remaining), backoff, exc
                )
                self._buffer.extendleft(reversed(remaining))
                self._writing = 0  # back in the buffer, so `buffered` counts each span once while we wait
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, RETRY_MAX_S)
            finally:
                self._writing = 0
                self._update_room()

    async def _build(self, batch: list[_Item]) -> list[Span]:
        pending = [item[1] for item in batch if isinstance(item, tuple) and item[1] is not None and not item[1].done()]
        if pending:
            await asyncio.wait(pending, timeout=SEQUENCE_WAIT_S)
        spans = []
        for item in batch:
            if isinstance(item, Span):
                spans.append(item)
                continue
            record, seq = item
            sequence_id = None
            if seq is not None:
                if seq.done() and not seq.cancelled() and seq.exception() is None:
                    sequence_id = seq.result()
                elif not seq.done():
                    seq.cancel()
            spans.append(build_llm_span(record, sequence_id))
        return spans

    async def _write(self, spans: list[Span]) -> None:
        assert self.store is not None
        try:
            await self.store.add_many_spans(spans)
            self.exported += len(spans)
            return
        except Exception as exc:
            if not is_rejection(exc):
                raise
        # One bad span (e.g. an attempt the store does not know) must not block the others.
        for index, span in enumerate(spans):
            try:
                await self.store.add_span(span)
                self.exported += 1
            except Exception as exc:
                if not is_rejection(exc):
                    # Keep the rest for the retry loop; the ones already written are done.
                    raise _PartialWrite(spans[index:]) from exc
                self.rejected += 1
                logger.warning("agl_proxy: the store rejected the span of rollout %r: %s", span.rollout_id, exc)


class _PartialWrite(Exception):
    def __init__(self, remaining: list[Span]) -> None:
        super().__init__(f"{len(remaining)} span(s) left to write")
        self.remaining = remaining
