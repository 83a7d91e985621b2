"""A cap on request body size, as pure ASGI middleware."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import PayloadTooLargeError
from ..web.wire import error_response


class BodySizeLimitMiddleware:
    """Answers 413 for a body over `max_bytes`.

    A declared Content-Length is checked before the app runs; a chunked body is counted as
    it is read, and going over raises `PayloadTooLargeError` inside the handler's read, which
    the handler renders as 413 before touching the store.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                if value.isdigit() and int(value) > self.max_bytes:
                    await error_response(self._error(int(value)))(scope, receive, send)
                    return
                break
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self._error(received)
            return message

        await self.app(scope, counting_receive, send)

    def _error(self, size: int) -> PayloadTooLargeError:
        return PayloadTooLargeError(f"request body of {size} bytes is over the limit of {self.max_bytes} bytes")
