"""Asynchronous, batched span export with a bounded buffer and retries.

The agent's call never waits for the store: a finished call is queued here and written
later with `add_many_spans`. When the store is slow or down, spans wait in the buffer
and the batch is retried with capped backoff; when the buffer is full the oldest span is
dropped, counted and logged.

Sequence numbers must follow call order within a rollout, also across proxy processes,
so each call asks the store for its number when the call starts (concurrently with the
backend call, adding no latency); the span is written with it later. If that request
fails (store down), the span is written without a number and the store issues one.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from typing import Deque, List, Optional, Tuple, Union

from agl_store.base import LightningStore
from agl_store.errors import StoreError
from agl_store.models import Span

from .spans import CallRecord, build_llm_span

logger = logging.getLogger(__name__)

DEFAULT_MAX_BUFFER = 10_000
DEFAULT_BATCH_SIZE = 256
DEFAULT_FLUSH_INTERVAL_S = 0.02
RETRY_BASE_S = 0.2
RETRY_MAX_S = 5.0
# How long a batch waits for the sequence numbers of its calls before it lets the store
# number them.
SEQUENCE_WAIT_S = 5.0

# A call whose span is not built yet, or a span built for an earlier, failed write (kept
# as is so that a retry keeps its span id and sequence number).
_Item = Union[Tuple[CallRecord, Optional["asyncio.Task[int]"]], Span]


def _is_rejection(exc: BaseException) -> bool:
    """True for a store error that retrying cannot fix (bad span, unknown attempt)."""
    return isinstance(exc, StoreError) and 400 <= exc.status_code < 500


class SpanExporter:
    """Writes call spans to a `LightningStore` in the background.

    `start()` inside a running loop, `submit()` from request handlers (never blocks),
    `stop()` to flush what the store accepts within the timeout.
    """

    def __init__(
        self,
        store: Optional[LightningStore],
        *,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        batch_size: int = DEFAULT_BATCH_SIZE,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
    ) -> None:
        self.store = store
        self.max_buffer = max_buffer
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.exported = 0
        self.dropped = 0
        self.failed_attempts = 0
        self._buffer: Deque[_Item] = deque()
        self._wakeup: Optional[asyncio.Event] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self._idle: Optional[asyncio.Event] = None

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def reserve_sequence(self, rollout_id: str, attempt_id: str) -> Optional["asyncio.Task[int]"]:
        """Ask the store for the call's sequence number now; None for calls without a rollout."""
        if self.store is None or not rollout_id or not attempt_id:
            return None
        return asyncio.ensure_future(self.store.get_next_span_sequence_id(rollout_id, attempt_id))

    def submit(self, record: CallRecord, sequence: Optional["asyncio.Task[int]"] = None) -> None:
        """Queue a finished call's span; drops the oldest one when the buffer is full."""
        if self.store is None:
            if sequence is not None:
                sequence.cancel()
            return
        if len(self._buffer) >= self.max_buffer:
            self._drop_item(self._buffer.popleft(), f"span buffer full ({self.max_buffer}); dropped the oldest span")
        self._buffer.append((record, sequence))
        if self._wakeup is not None and self._idle is not None:
            # Not idle from now on, so that `flush()` waits for this span, not only for the batch in flight.
            self._idle.clear()
            self._wakeup.set()

    def _drop_item(self, item: _Item, why: str) -> None:
        if isinstance(item, tuple) and item[1] is not None:
            item[1].cancel()
        self._drop(1, why)

    def _drop(self, count: int, why: str) -> None:
        self.dropped += count
        logger.warning("agl_proxy dropped %d span(s) (%d in total): %s", count, self.dropped, why)

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task = asyncio.create_task(self._run(), name="agl-proxy-span-exporter")

    async def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until the buffer is empty; False if `timeout` passed first."""
        if self._task is None or self._idle is None:
            return not self._buffer
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def stop(self, timeout: float = 5.0) -> None:
        """Flush for at most `timeout` seconds, then drop (and count) what is left."""
        if self._task is None:
            return
        await self.flush(timeout)
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self._task = None
        while self._buffer:
            self._drop_item(self._buffer.popleft(), "the proxy stopped before the store accepted it")

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
            spans = await self._build(batch)
            try:
                await self._write(spans)
                backoff = RETRY_BASE_S
            except asyncio.CancelledError:
                self._buffer.extendleft(reversed(spans))
                raise
            except Exception as exc:  # noqa: BLE001 - store down or failing: keep the spans, retry later
                remaining = exc.remaining if isinstance(exc, _PartialWrite) else spans
                self.failed_attempts += 1
                logger.warning(
                    "agl_proxy could not export %d span(s), retrying in %.1f s: %r", len(remaining), backoff, exc
                )
                self._requeue(remaining)
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, RETRY_MAX_S)

    def _requeue(self, spans: List[Span]) -> None:
        room = self.max_buffer - len(self._buffer)
        if room < len(spans):
            self._drop(len(spans) - room, f"span buffer full ({self.max_buffer}) while the store is unavailable")
            spans = spans[len(spans) - max(room, 0) :]
        self._buffer.extendleft(reversed(spans))

    async def _build(self, batch: List[_Item]) -> List[Span]:
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

    async def _write(self, spans: List[Span]) -> None:
        assert self.store is not None
        try:
            await self.store.add_many_spans(spans)
            self.exported += len(spans)
            return
        except Exception as exc:
            if not _is_rejection(exc):
                raise
        # One bad span (e.g. an attempt the store does not know) must not block the others.
        for index, span in enumerate(spans):
            try:
                await self.store.add_span(span)
                self.exported += 1
            except Exception as exc:
                if not _is_rejection(exc):
                    # Keep the rest for the retry loop; the ones already written are done.
                    raise _PartialWrite(spans[index:]) from exc
                self._drop(1, f"the store rejected the span of rollout {span.rollout_id!r}: {exc}")


class _PartialWrite(Exception):
    def __init__(self, remaining: List[Span]) -> None:
        super().__init__(f"{len(remaining)} span(s) left to write")
        self.remaining = remaining
