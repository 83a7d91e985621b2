"""Bearer-key authentication as pure ASGI middleware (streams pass through untouched)."""

from __future__ import annotations

import hmac
from typing import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import AuthenticationError, ProxyError

OPEN_PATHS = frozenset({"/health"})


async def send_error(send: Send, error: ProxyError) -> None:
    """Answer with `error` in OpenAI's error format."""
    headers = [(b"content-type", b"application/json")]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": error.body()})


class BearerKeyMiddleware:
    """Requires `Authorization: Bearer <key>` on every HTTP route but the open ones."""

    def __init__(self, app: ASGIApp, key: str, open_paths: Collection[str] = OPEN_PATHS) -> None:
        self.app = app
        self._expected = f"Bearer {key}".encode()
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        if given is None:
            await send_error(
                send, AuthenticationError("missing bearer key: send the header 'Authorization: Bearer <agl key>'")
            )
            return
        if not hmac.compare_digest(given, self._expected):
            await send_error(
                send, AuthenticationError("wrong bearer key: the Authorization header does not carry this proxy's key")
            )
            return
        await self.app(scope, receive, send)
