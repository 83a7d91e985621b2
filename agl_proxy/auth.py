"""Bearer-key authentication for the proxy: the store's middleware with OpenAI's error format."""

from __future__ import annotations

from collections.abc import Collection

from starlette.types import ASGIApp

from agl_store.web import auth as store_auth

from .errors import AuthenticationError


def render_openai_error(message: str) -> bytes:
    """A 401 body OpenAI SDKs read as their AuthenticationError."""
    return AuthenticationError(message).body()


class BearerKeyMiddleware(store_auth.BearerKeyMiddleware):
    """Requires `Authorization: Bearer <key>` (or one of `other_keys`) on every HTTP route but the open ones."""

    def __init__(
        self,
        app: ASGIApp,
        key: str,
        open_paths: Collection[str] = (),
        *,
        other_keys: Collection[str] = (),
        what: str = "the proxy's key",
    ) -> None:
        super().__init__(app, key, open_paths, render=render_openai_error, other_keys=other_keys, what=what)
