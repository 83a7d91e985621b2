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
WRONG_KEY = "wrong bearer key: the Authorization header does not carry {what}"


def render_store_error(message: str) -> bytes:
    """The store's error shape, code `unauthorized`."""
    return error_body("unauthorized", message)


def bearer_token(scope: Scope) -> bytes | None:
    """The token of the request's `Authorization: Bearer <token>` header; None without one.

    The scheme name is case-insensitive (RFC 7235): `bearer x` and `BEARER x` carry `x`.
    A header of another scheme yields b"" (present, but no bearer token).
    """
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return None


class BearerKeyMiddleware:
    """Answers 401 unless the request carries `Authorization: Bearer <key>` with one of the keys.

    `open_paths` (health checks, a page shell) pass without a key; `render` writes the
    401 body (the store's error shape unless told otherwise); `what` names the expected key
    in the wrong-key message.
    """

    def __init__(
        self,
        app: ASGIApp,
        key: str,
        open_paths: Collection[str] = (),
        render: Renderer = render_store_error,
        *,
        other_keys: Collection[str] = (),
        what: str = "this server's key",
    ) -> None:
        self.app = app
        # Distinct keys only: the proxy passes its admin key as another key, often the same one.
        self._expected = list(dict.fromkeys(k.encode() for k in (key, *other_keys) if k))
        self.open_paths = frozenset(open_paths)
        self._render = render
        self._wrong = WRONG_KEY.format(what=what)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = bearer_token(scope)
        if given is None:
            await self._unauthorized(send, MISSING_KEY)
        # A list, not a generator: every key is compared, so timing does not tell which matched.
        elif not any([hmac.compare_digest(given, expected) for expected in self._expected]):
            await self._unauthorized(send, self._wrong)
        else:
            await self.app(scope, receive, send)

    async def _unauthorized(self, send: Send, message: str) -> None:
        body = self._render(message)
        headers = [
            (b"content-type", JSON_MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
            (b"x-content-type-options", b"nosniff"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
