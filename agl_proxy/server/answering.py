"""`ClientAnswer`: what the proxy sends the client of one call, watched on its way.

It knows whether the answer has started (a cancelled call then ends its stream with an
error event rather than a 503), and with `require_token_ids` it keeps back what would
commit the call as a success (a whole non-streamed answer, a stream's `data: [DONE]`)
until the call's token ids are checked, so that a call without them is answered 502
(or, mid-stream, with an error event the OpenAI SDKs raise on).

It also holds the answer's last bytes until the call's sequence number is issued (at most
`NUMBER_WAIT_S`), so that a call an agent makes after another's answer always numbers
after it, also when the two go to different proxies of a fleet. A real engine call outlasts
the store's reply, so this costs nothing but for a slow or lost store.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message, Send

from ..common.errors import ProxyError, TokenIdsError, send_error
from ..recording.call_record import CallRecord

DONE = b"data: [DONE]\n\n"
NUMBER_WAIT_S = 1.0
"""How long an answer's end waits for the call's sequence number at most."""


class ClientAnswer:
    """A `send` for one call's answer."""

    def __init__(self, send: Send, record: CallRecord, require_token_ids: bool) -> None:
        self._send = send
        self.record = record
        self.require_token_ids = require_token_ids
        self.started = False
        """The response's status line went out (the client sees a status other than ours)."""
        self.finished = False
        self._held_start: Message | None = None
        self._held_done = False
        self.number: asyncio.Future[int] | None = None
        """The call's sequence number as the store issues it; the answer's end waits for it."""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if self.require_token_ids and message["status"] < 300:
                self._held_start = message
                return
            await self._start(message)
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        body: bytes = message.get("body", b"")
        if message.get("more_body", False):
            if self._held_start is not None:
                await self._start(self._held_start)  # a stream: its chunks pass as they come
            if self.require_token_ids and body.endswith(DONE) and self.record.error is None:
                self._held_done = True
                body = body[: -len(DONE)]
            if body:
                await self._send({**message, "body": body})
            return
        await self._finish(message, body)

    async def _start(self, message: Message) -> None:
        self._held_start = None
        self.started = True
        await self._send(message)

    async def _finish(self, message: Message, body: bytes) -> None:
        record = self.record
        checked = record.check_token_ids() if self.require_token_ids else None
        if checked is not None and checked[0] != "ok":
            backend = record.deployment.label if record.deployment else "?"
            error = TokenIdsError(
                f"backend {backend} answered without usable token ids ({checked[1]}); "
                "this proxy requires them (--require-token-ids)"
            )
            record.fail_with(error)
            await self.fail(error)
            return
        if self._held_start is not None:
            await self._start(self._held_start)
        if self._held_done:
            await self._send({"type": "http.response.body", "body": DONE, "more_body": True})
        self.finished = True
        await self._numbered()
        await self._send({**message, "body": body})

    async def fail(self, error: ProxyError) -> None:
        """Answer `error`: as the response when none started, else as a stream's last event."""
        if self.finished:
            return
        self.finished = True
        await self._numbered()
        if not self.started:
            await send_error(self._send, error)
            return
        end: dict[str, Any] = {"type": "http.response.body", "body": error.sse_event(), "more_body": False}
        await self._send(end)

    async def _numbered(self) -> None:
        if self.number is not None and not self.number.done():
            await asyncio.wait((self.number,), timeout=NUMBER_WAIT_S)
