"""Bearer-key authentication for the proxy: the store's middleware with OpenAI's error format."""

from __future__ import annotations

from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from agl_store.web import auth as store_auth

from ..common.errors import AuthenticationError


def render_openai_error(message: str) -> bytes:
    """A 401 body OpenAI SDKs read as their AuthenticationError."""
    return AuthenticationError(message).body()


class BearerKeyMiddleware(store_auth.BearerKeyMiddleware):
    """Requires `Authorization: Bearer <key>` (or one of `other_keys`) on every HTTP route but the open ones.

    Anthropic's SDKs send their key as `x-api-key`; without an `Authorization` header, that is the key.
    """

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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            api_key = next((value for name, value in headers if name == b"x-api-key"), None)
            if api_key is not None and not any(name == b"authorization" for name, _ in headers):
                scope = {**scope, "headers": [*headers, (b"authorization", b"Bearer " + api_key)]}
        await super().__call__(scope, receive, send)
