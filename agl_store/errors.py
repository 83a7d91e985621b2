"""The store's exceptions. Each carries the HTTP status the server answers with.

The HTTP client maps error responses back to these same classes, so code written
against an embedded store handles a remote one unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable


class StoreError(Exception):
    """Base class of every error the store raises on purpose."""

    status_code: int = 500
    code: str = "store_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class InvalidInputError(StoreError, ValueError):
    """A request named a bad value: wrong type, unknown status, malformed body."""

    status_code = 400
    code = "invalid_input"


class RequestValidationError(InvalidInputError):
    """A request body or query string does not fit its route's schema (a missing field, a wrong
    type): 422, as agent-lightning 0.3's FastAPI server answers. Python callers catch it as
    InvalidInputError."""

    status_code = 422
    code = "validation_error"


class NotFoundError(StoreError, ValueError):
    """A rollout, attempt, resource set or worker that does not exist."""

    status_code = 404
    code = "not_found"


class ConflictError(StoreError, ValueError):
    """The request is valid but not in the object's current state (e.g. an illegal status move)."""

    status_code = 409
    code = "conflict"


class PayloadTooLargeError(StoreError, ValueError):
    status_code = 413
    code = "payload_too_large"


class UnauthorizedError(StoreError):
    status_code = 401
    code = "unauthorized"


class StoreClosedError(StoreError, RuntimeError):
    """The store was used after `close()`."""

    status_code = 503
    code = "store_closed"


class StoreUnavailableError(StoreError, ConnectionError):
    """A remote store could not be reached after the client's retries."""

    status_code = 503
    code = "store_unavailable"


ERRORS_BY_CODE: dict[str, type[StoreError]] = {
    cls.code: cls
    for cls in (
        StoreError,
        InvalidInputError,
        RequestValidationError,
        NotFoundError,
        ConflictError,
        PayloadTooLargeError,
        UnauthorizedError,
        StoreClosedError,
        StoreUnavailableError,
    )
}


def invalid_sort_by(sort_by: object, allowed: Iterable[str]) -> InvalidInputError:
    """The error for an unsupported sort field, worded as agent-lightning 0.3 words it (clients match on it)."""
    return InvalidInputError(f"Invalid sort_by: {sort_by}, allowed fields are: {', '.join(allowed)}")
