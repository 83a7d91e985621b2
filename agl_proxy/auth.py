"""Bearer-key authentication for the proxy: the store's middleware with OpenAI's error format."""

from __future__ import annotations

from collections.abc import Collection

from starlette.types import ASGIApp, Send

from agl_store.server import auth as store_auth

from .errors import AuthenticationError, ProxyError

OPEN_PATHS = frozenset({"/health"})


async def send_error(send: Send, error: ProxyError) -> None:
    """Answer with `error` in OpenAI's error format."""
    headers = [(b"content-type", b"application/json")]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": error.body()})


def render_openai_error(message: str) -> bytes:
    """A 401 body OpenAI SDKs read as their AuthenticationError."""
    return AuthenticationError(message).body()


class BearerKeyMiddleware(store_auth.BearerKeyMiddleware):
    """Requires `Authorization: Bearer <key>` on every HTTP route but the open ones."""

    def __init__(self, app: ASGIApp, key: str, open_paths: Collection[str] = OPEN_PATHS) -> None:
        super().__init__(app, key, open_paths, render=render_openai_error)
