"""Optional bearer-key authentication as pure ASGI middleware (streams pass through untouched).

The store server and the proxy share it; each renders the 401 body in its own error format.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from .wire import JSON_MEDIA_TYPE, error_body

Renderer = Callable[[str], bytes]
"""The JSON body of a 401 answer, given what is wrong."""

MISSING_KEY = "missing bearer key: send the header 'Authorization: Bearer <key>'"
WRONG_KEY = "wrong bearer key: the Authorization header does not carry this server's key"


def render_store_error(message: str) -> bytes:
    """The store's error shape, code `unauthorized`."""
    return error_body("unauthorized", message)


class BearerKeyMiddleware:
    """Answers 401 unless the request carries `Authorization: Bearer <key>`.

    `open_paths` (health checks, a page shell) pass without a key; `render` writes the
    401 body (the store's error shape unless told otherwise).
    """

    def __init__(
        self, app: ASGIApp, key: str, open_paths: Collection[str] = (), render: Renderer = render_store_error
    ) -> None:
        self.app = app
        self._expected = f"Bearer {key}".encode()
        self.open_paths = frozenset(open_paths)
        self._render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope["headers"] if name == b"authorization"), None)
        if given is None:
            await self._unauthorized(send, MISSING_KEY)
        elif not hmac.compare_digest(given, self._expected):
            await self._unauthorized(send, WRONG_KEY)
        else:
            await self.app(scope, receive, send)

    async def _unauthorized(self, send: Send, message: str) -> None:
        body = self._render(message)
        headers = [
            (b"content-type", JSON_MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
