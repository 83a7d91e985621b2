"""Optional bearer-key authentication as pure ASGI middleware."""

from __future__ import annotations

import hmac
from typing import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from .wire import JSON_MEDIA_TYPE, error_body


class BearerKeyMiddleware:
    """Answers 401 unless the request carries `Authorization: Bearer <key>`.

    `open_paths` (the health checks) pass without a key.
    """

    def __init__(self, app: ASGIApp, key: str, open_paths: Collection[str] = ()) -> None:
        self.app = app
        self._expected = f"Bearer {key}".encode()
        self._open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._open_paths:
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope["headers"] if name == b"authorization"), None)
        if given is None:
            await _unauthorized(send, "missing bearer key: send the header 'Authorization: Bearer <key>'")
        elif not hmac.compare_digest(given, self._expected):
            await _unauthorized(send, "wrong bearer key in the Authorization header")
        else:
            await self.app(scope, receive, send)


async def _unauthorized(send: Send, message: str) -> None:
    body = error_body("unauthorized", message)
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", JSON_MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b"Bearer"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
