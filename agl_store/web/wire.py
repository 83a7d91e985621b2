"""Bytes in, bytes out: request parsing, response encoding and the one JSON error shape.

Every handler goes through `endpoint()`, so a store error, a validation error or a bug all
leave the server as `{"error": {"code", "message"}, "detail": message}` with the error's
HTTP status. `detail` is there because agent-lightning 0.3 clients read it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import to_json
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..base import LightningStore
from ..errors import InvalidInputError, RequestValidationError, StoreError

logger = logging.getLogger("agl_store.server")

JSON_MEDIA_TYPE = "application/json"
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Handler = Callable[[Request], Awaitable[Any]]


def encode(value: Any) -> bytes:
    """Serialise a response value (models, lists of models, plain JSON) to JSON bytes.

    pydantic-core's serialiser walks models in Rust: about three times faster than
    `model_dump()` followed by orjson on span-sized payloads.
    """
    return to_json(value)


def parse_json(body: bytes) -> Any:
    """The body as plain JSON values; malformed JSON is an InvalidInputError.

    orjson then python-mode validation is about twice as fast as pydantic's own JSON parser
    on bodies full of token-id arrays.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"malformed JSON body: {exc}") from None


def json_response(value: Any, status_code: int = 200) -> Response:
    """A JSON response whose body is already encoded by orjson."""
    return Response(encode(value), status_code=status_code, media_type=JSON_MEDIA_TYPE)


def error_body(code: str, message: str) -> bytes:
    """The error shape of every store route."""
    return orjson.dumps({"error": {"code": code, "message": message}, "detail": message})


def error_response(error: StoreError) -> Response:
    return Response(error_body(error.code, error.message), status_code=error.status_code, media_type=JSON_MEDIA_TYPE)


async def http_error_response(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no such route) and 405 (wrong method) in the store's error shape.

    The codes differ from `not_found` on purpose: an unknown route is not an unknown id.
    """
    assert isinstance(exc, HTTPException)
    code = {404: "no_such_route", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = f"{exc.detail}: {request.method} {request.url.path}"
    return Response(error_body(code, message), exc.status_code, headers=exc.headers, media_type=JSON_MEDIA_TYPE)


def describe_validation_error(exc: ValidationError) -> str:
    """`field.path: what is wrong` for each problem (the first five), joined by '; '."""
    parts = []
    for item in exc.errors(include_url=False)[:5]:
        if item["type"] == "json_invalid":
            parts.append(f"malformed JSON body: {item.get('ctx', {}).get('error', item['msg'])}")
            continue
        location = ".".join(str(p) for p in item["loc"]) or "body"
        parts.append(f"{location}: {item['msg']}")
    more = exc.error_count() - 5
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


def _validated(validate: Callable[[Any], T], data: Any) -> T:
    """`validate(data)`, its problems as a RequestValidationError (422, as agent-lightning 0.3's server)."""
    try:
        return validate(data)
    except ValidationError as exc:
        raise RequestValidationError(describe_validation_error(exc)) from None


def validate_json(adapter: TypeAdapter[T], body: bytes) -> T:
    """Parse and validate a JSON body: malformed JSON is a 400, a body that does not fit a 422."""
    return _validated(adapter.validate_python, parse_json(body))


def validate_model(model: type[M], body: bytes, *, allow_empty: bool = False) -> M:
    """Like `validate_json` for a model; an empty body is the model's defaults when allowed."""
    stripped = body.strip()
    if not stripped or stripped == b"null":
        if allow_empty:
            return model()
        raise RequestValidationError("request body is empty; expected a JSON object")
    return _validated(model.model_validate, parse_json(body))


def validate_query(model: type[M], request: Request, list_fields: Sequence[str] = ()) -> M:
    """Validate query parameters against a model; `list_fields` take repeated keys."""
    params = request.query_params
    data: dict[str, Any] = {}
    for key in params.keys():
        data[key] = params.getlist(key) if key in list_fields else params[key]
    return _validated(model.model_validate, data)


def endpoint(path: str, handler: Handler, *, methods: Sequence[str], status_code: int = 200) -> Route:
    """A route whose handler returns a JSON-able value (or a ready Response).

    Store errors and validation errors become their 4xx; anything else is a bug, logged
    once with its traceback, and answered with a 500 that names the exception type.
    """

    async def run(request: Request) -> Response:
        try:
            result = await handler(request)
        except StoreError as exc:
            return error_response(exc)
        except ValidationError as exc:
            return error_response(RequestValidationError(describe_validation_error(exc)))
        except Exception as exc:
            logger.exception("%s %s failed", request.method, path)
            return error_response(StoreError(f"internal server error: {type(exc).__name__}: {exc}"))
        if isinstance(result, Response):
            return result
        return json_response(result, status_code)

    run.__name__ = getattr(handler, "__name__", "endpoint")
    return Route(path, run, methods=list(methods))


def store_of(request: Request) -> LightningStore:
    """The store the app opened in its lifespan."""
    store: LightningStore = request.scope["state"]["store"]
    return store
