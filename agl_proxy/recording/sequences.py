"""Sequence numbers for calls, asked of the store at each call's start, many calls per request.

A call's number must follow call order within its rollout, also across proxy processes
sharing a store, so it is issued by the store when the call starts, not when its span is
written. One store request per call costs the store one write each (a savepoint and a few
statements on its single writer) and the proxy's event loop one task each; at a thousand
calls per second those writes crowded out the span batches themselves. Here the calls
that start while a request is in flight share the next one (`get_many_span_sequence_ids`,
numbers handed out in the order the calls started), so there is at most one request in
flight and its size follows the load.
"""

from __future__ import annotations

import asyncio
import logging

from agl_store.base import LightningStore
from agl_store.errors import StoreError

logger = logging.getLogger(__name__)

MAX_PER_REQUEST = 1024
"""Reservations sent in one store request at most."""

_Pending = tuple[str, str, "asyncio.Future[int]"]


def is_rejection(exc: BaseException) -> bool:
    """True for a store error that retrying cannot fix (bad span, unknown rollout or attempt)."""
    return isinstance(exc, StoreError) and 400 <= exc.status_code < 500


class SequenceReserver:
    """`reserve()` from a call's handler (never blocks); the number arrives in the future it returns."""

    def __init__(self, store: LightningStore) -> None:
        self.store = store
        self._pending: list[_Pending] = []
        self._task: asyncio.Task[None] | None = None

    def reserve(self, rollout_id: str, attempt_id: str) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((rollout_id, attempt_id, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="agl-proxy-sequence-reserver")
        return future

    async def _run(self) -> None:
        while self._pending:
            batch = self._pending[:MAX_PER_REQUEST]
            del self._pending[:MAX_PER_REQUEST]
            await self._issue(batch)

    async def _issue(self, batch: list[_Pending]) -> None:
        try:
            ids = await self.store.get_many_span_sequence_ids([(rid, aid) for rid, aid, _ in batch])
        except Exception as exc:  # the spans are then numbered by the store when written
            if is_rejection(exc) and len({(rid, aid) for rid, aid, _ in batch}) > 1:
                # One unknown attempt must not cost the other rollouts their numbers.
                await self._issue_per_attempt(batch)
                return
            _fail(batch, exc)
            return
        for (_, _, future), sequence_id in zip(batch, ids, strict=True):
            if not future.done():
                future.set_result(sequence_id)

    async def _issue_per_attempt(self, batch: list[_Pending]) -> None:
        groups: dict[tuple[str, str], list[_Pending]] = {}
        for entry in batch:
            groups.setdefault((entry[0], entry[1]), []).append(entry)
        for group in groups.values():
            await self._issue(group)

    async def close(self) -> None:
        """Wait until the reservations made so far are sent (a later `reserve()` starts sending again)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


def _fail(batch: list[_Pending], exc: BaseException) -> None:
    logger.warning("agl_proxy could not reserve %d sequence number(s); the store will number them: %r", len(batch), exc)
    for _, _, future in batch:
        if not future.done():
            future.set_exception(exc)
