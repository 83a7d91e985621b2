"""Bearer-key authentication for the proxy: the store's middleware with OpenAI's error format."""

from __future__ import annotations

from collections.abc import Collection

from starlette.types import ASGIApp

from agl_store.server import auth as store_auth

from .errors import AuthenticationError

OPEN_PATHS = frozenset({"/health"})


def render_openai_error(message: str) -> bytes:
    """A 401 body OpenAI SDKs read as their AuthenticationError."""
    return AuthenticationError(message).body()


class BearerKeyMiddleware(store_auth.BearerKeyMiddleware):
    """Requires `Authorization: Bearer <key>` on every HTTP route but the open ones."""

    def __init__(self, app: ASGIApp, key: str, open_paths: Collection[str] = OPEN_PATHS) -> None:
        super().__init__(app, key, open_paths, render=render_openai_error)
