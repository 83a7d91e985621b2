"""Input checks of the SQLiteStore, run on the event loop before any transaction, so bad input
never takes the write lock: each names the field, and encodes what it checked for the row."""

from __future__ import annotations

import time
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from ..bounds import check_field_depths, check_integer, check_json_depth
from ..errors import InvalidInputError, invalid_sort_by
from ..models import NamedResources, Rollout, RolloutConfig, Span, new_id
from ..transitions import check_rollout_mode
from .queue import NewRollout
from .schema import encode_span_row
from .spans import EncodedSpan

T = TypeVar("T")

_RESOURCES: TypeAdapter[NamedResources] = TypeAdapter(NamedResources)


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any, field: str) -> bytes:
    check_json_depth(value, field)
    try:
        return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:
        raise InvalidInputError(f"{field} is not JSON: {exc}") from exc


def validate(model: type[T], value: Any, field: str) -> T:
    try:
        return model.model_validate(value)  # type: ignore[attr-defined]
    except ValidationError as exc:
        raise InvalidInputError(f"{field}: {exc.errors()[0]['msg']} ({exc.error_count()} error(s))") from exc


def check_config(config: Any) -> RolloutConfig:
    if isinstance(config, RolloutConfig):
        return config
    return validate(RolloutConfig, config, "config")


def check_metadata(metadata: Any, field: str = "metadata") -> Any:
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInputError(f"{field} must be an object or null, got {type(metadata).__name__}")
    return metadata


def check_metadata_match(metadata: Any) -> dict[str, str]:
    """A dequeue's metadata filter: an object of string keys (without `"` or `\\`, which a JSON
    path would need to escape) to string values; None is no filter."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InvalidInputError(f"metadata must be an object of strings or null, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not key or '"' in key or "\\" in key:
            raise InvalidInputError(f"metadata keys must be non-empty strings without '\"' or '\\\\', got {key!r}")
        if not isinstance(value, str):
            raise InvalidInputError(f"metadata[{key!r}] must be a string, got {type(value).__name__}")
    return dict(metadata)


def check_number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(f"{field} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int past the largest double
        raise InvalidInputError(f"{field} is out of range, got {value!r}") from None


def check_logic(filter_logic: Any) -> str:
    if filter_logic not in ("and", "or"):
        raise InvalidInputError(f"filter_logic must be 'and' or 'or', got {filter_logic!r}")
    return filter_logic


def as_list(values: Any, field: str) -> list[Any]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, set, frozenset)):
        raise InvalidInputError(f"{field} must be a list, got {type(values).__name__}")
    return list(values)


def check_sort(sort_by: str | None, allowed: frozenset[str], sort_order: Any) -> None:
    if sort_order not in ("asc", "desc"):
        raise InvalidInputError(f"sort_order must be 'asc' or 'desc', got {sort_order!r}")
    if sort_by is not None and sort_by not in allowed:
        raise invalid_sort_by(sort_by, sorted(allowed))


def check_paging(limit: Any, offset: Any) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < -1:
        raise InvalidInputError(f"limit must be -1 (no limit) or an int >= 0, got {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidInputError(f"offset must be an int >= 0, got {offset!r}")
    check_integer(limit, "limit")
    check_integer(offset, "offset")


MAX_IDEMPOTENCY_KEY_CHARS = 200
"""Longer than any UUID or hash a caller would use, short enough to index cheaply."""


def check_idempotency_key(key: Any, field: str = "idempotency_key") -> str | None:
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= MAX_IDEMPOTENCY_KEY_CHARS):
        raise InvalidInputError(
            f"{field} must be null or a string of 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters, got {key!r:.60}"
        )
    return key


def new_rollout(
    input: Any,
    mode: Any,
    resources_id: str | None,
    config: Any,
    metadata: Any,
    idempotency_key: Any = None,
    key_field: str = "idempotency_key",
) -> NewRollout:
    key = check_idempotency_key(idempotency_key, key_field)
    rollout = Rollout(
        rollout_id=new_id("ro"),
        input=input,
        start_time=time.time(),
        mode=check_rollout_mode(mode),
        resources_id=resources_id,
        status="queuing",
        config=RolloutConfig() if config is None else check_config(config).model_copy(deep=True),
        metadata=dict(check_metadata(metadata) or {}),
    )
    return NewRollout(rollout, dumps(rollout.input, "input"), dumps(rollout.metadata, "metadata"), key)


def encode_span(span: Any, index: int, packed: bytes | None = None) -> EncodedSpan:
    if not isinstance(span, Span):
        span = validate(Span, span, f"spans[{index}]")
    # 0 is agent-lightning 0.3's "no particular order" (its `Span.from_attributes` default).
    if span.sequence_id is not None and (isinstance(span.sequence_id, bool) or span.sequence_id < 0):
        raise InvalidInputError(f"spans[{index}].sequence_id must be >= 0, got {span.sequence_id!r}")
    if span.sequence_id is not None:
        check_integer(span.sequence_id, f"spans[{index}].sequence_id")
    # Token-bearing attributes get their depth checked on the packing walk (encode_span_row).
    check_field_depths(span, f"spans[{index}]", skip="attributes" if packed is None else "")
    try:
        return EncodedSpan(span, *encode_span_row(span, span.sequence_id, packed))
    except TypeError as exc:
        raise InvalidInputError(f"spans[{index}] is not JSON: {exc}") from exc
    except InvalidInputError as exc:
        raise InvalidInputError(f"spans[{index}].{exc.message}") from None


def encode_resources(resources: Any) -> tuple[NamedResources, bytes]:
    try:
        validated = _RESOURCES.validate_python(resources)
    except ValidationError as exc:
        raise InvalidInputError(f"resources: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}") from exc
    check_json_depth(validated, "resources")
    try:
        return validated, _RESOURCES.dump_json(validated)
    except PydanticSerializationError as exc:
        raise InvalidInputError(f"resources are not JSON: {exc}") from exc
