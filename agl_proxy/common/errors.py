"""The proxy's exceptions, each rendered as an OpenAI-format error response.

Clients of the proxy are OpenAI SDKs, so every error the proxy itself produces has the
shape `{"error": {"message", "type", "code"}}` and a status the SDKs map to their own
exception classes (404 NotFound, 429 RateLimit, 502/503/504 APIStatusError, ...).
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from starlette.types import Send

MAX_ECHO_CHARS = 200
"""Text from elsewhere (a backend's error, a pause reason) is cut to this before the proxy repeats it."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def short_text(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """`text` on one line, control characters replaced, cut to `limit` characters (with '…')."""
    text = _CONTROL.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ProxyError(Exception):
    """An error the proxy answers with instead of a backend response."""

    status_code: int = 500
    type: str = "server_error"
    code: str = "proxy_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}

    def body(self) -> bytes:
        return orjson.dumps(self.to_dict())

    def sse_event(self) -> bytes:
        """The error as a stream event: the OpenAI SDKs raise on it, so a cut stream is not taken as complete."""
        return b"data: " + self.body() + b"\n\n"


class BadRequestError(ProxyError):
    status_code = 400
    type = "invalid_request_error"
    code = "bad_request"


class AuthenticationError(ProxyError):
    status_code = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class ModelNotFoundError(ProxyError):
    """The request names no model, or one the proxy does not serve."""

    status_code = 404
    type = "invalid_request_error"
    code = "model_not_found"


class PausedError(ProxyError):
    """New calls while the proxy stays paused (e.g. during a weight update) past the hold bound."""

    status_code = 429
    type = "rate_limit_error"
    code = "proxy_paused"


class SpanBacklogError(ProxyError):
    """New calls while the store has not caught up with the spans of earlier ones."""

    status_code = 503
    type = "api_error"
    code = "span_backlog"
    retry_after_s = 1

    @classmethod
    def for_backlog(cls, backlog: int, waited_s: float) -> SpanBacklogError:
        return cls(
            f"the trace store is behind: {backlog} span(s) of earlier calls are not written yet after waiting "
            f"{waited_s:g} s; retry after {cls.retry_after_s} s",
            headers={"retry-after": str(cls.retry_after_s)},
        )


class BackendFailedError(ProxyError):
    """The backend refused the connection, failed, or answered something unreadable."""

    status_code = 502
    type = "api_error"
    code = "backend_error"


class TokenIdsError(ProxyError):
    """The backend answered without token ids (or with fewer than its usage counts) and the
    proxy is set to require them."""

    status_code = 502
    type = "api_error"
    code = "token_ids_missing"


class CancelledForUpdateError(ProxyError):
    """A call in flight cut because a pause's drain timed out (the weights are about to change)."""

    status_code = 503
    type = "api_error"
    code = "cancelled_for_weight_update"
    retry_after_s = 5

    @classmethod
    def for_pause(cls, reason: str | None) -> CancelledForUpdateError:
        why = f" ({reason})" if reason else ""
        return cls(
            f"the call was cancelled by the proxy for a weight update{why}: it was still running when the "
            f"drain timed out; retry after {cls.retry_after_s} s",
            headers={"retry-after": str(cls.retry_after_s)},
        )


class NoBackendError(ProxyError):
    status_code = 503
    type = "api_error"
    code = "no_backend"


class BackendTimeoutError(ProxyError):
    status_code = 504
    type = "api_error"
    code = "backend_timeout"


def render_error(code: str, message: str) -> bytes:
    """An OpenAI-shaped error body for a refusal the proxy's middleware makes (401, 403, 415)."""
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code}})


async def send_error(send: Send, error: ProxyError) -> None:
    """Answer an ASGI request with `error` in OpenAI's error format."""
    headers = [(b"content-type", b"application/json"), (b"x-content-type-options", b"nosniff")]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": error.body()})
