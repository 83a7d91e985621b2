"""What the store takes, so that everything it stores can be read back.

- Integers (a page's `limit` and `offset`, a dequeue's `limit`, a span's `sequence_id`) are
  at most `MAX_INTEGER`. SQLite's INTEGER is signed 64-bit: a value past it was a 500
  (`OverflowError`), and a counter at its top turned into a float. Below 2^53 every JSON
  reader holds the value exactly (JavaScript, OTLP's doubles) and a counter there still
  has room to count.
- JSON values (a rollout's input, metadata, heartbeat stats, a span, a resource set) nest
  at most `MAX_JSON_DEPTH` containers deep. orjson writes at most 254 levels and
  pydantic-core about as many; a value stored deeper than a response could hold broke
  every read of its table (and a dequeue claimed it while answering 500). 128 leaves room
  for the envelope of a response (`{"items": [...]}`) and is serde_json's default too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from .errors import InvalidInputError

MAX_INTEGER = 2**53 - 1
"""The largest limit, offset or sequence id the store takes (JavaScript's MAX_SAFE_INTEGER)."""

MAX_JSON_DEPTH = 128
"""How many containers (objects, arrays) deep a stored JSON value may nest; `{"a": [1]}` is 2."""

_SCALARS = frozenset({str, int, float, bool, type(None)})


def check_integer(value: int, field: str) -> int:
    """`value`, or InvalidInputError naming `field` when it is above `MAX_INTEGER`."""
    if value > MAX_INTEGER:
        raise InvalidInputError(f"{field} must be at most {MAX_INTEGER} (2^53 - 1), got {value}")
    return value


def too_deep(field: str) -> InvalidInputError:
    """The error for a value of `field` nested deeper than `MAX_JSON_DEPTH`."""
    return InvalidInputError(f"{field} nests deeper than {MAX_JSON_DEPTH} levels of objects and arrays")


def check_json_depth(value: Any, field: str) -> None:
    """InvalidInputError naming `field` when `value` nests deeper than `MAX_JSON_DEPTH`.

    Walks dicts, lists, tuples, pydantic models (an object each, extra fields included) and
    dataclasses; a list of scalars is passed over at C speed, yet that is most of the cost
    on token ids, so span attributes are checked on `packed_attributes.pack_attributes`' walk instead.
    """
    if type(value) not in _SCALARS and _nests_deeper(value, MAX_JSON_DEPTH):
        raise too_deep(field)


def check_field_depths(model: BaseModel, prefix: str, *, skip: str = "") -> None:
    """`check_json_depth` on each field of `model` (extra fields too) but `skip`, naming it
    `prefix.field`. Reads the model's dict: pydantic's own iteration costs more than the check."""
    for name, value in (*model.__dict__.items(), *(model.__pydantic_extra__ or {}).items()):
        if name != skip and type(value) not in _SCALARS and _nests_deeper(value, MAX_JSON_DEPTH):
            raise too_deep(f"{prefix}.{name}")


def _nests_deeper(container: Any, room: int) -> bool:
    """Whether `container`, given `room` levels, nests deeper (a non-container is given none)."""
    kind = type(container)
    if kind is dict:
        children: Iterable[Any] = container.values()
    elif kind is list or kind is tuple:
        children = container
    else:
        found = _children(container)
        if found is None:
            return False
        children = found
    if room == 0:
        return True
    if _SCALARS.issuperset(map(type, children)):
        return False
    return any(type(child) not in _SCALARS and _nests_deeper(child, room - 1) for child in children)


def _children(value: Any) -> Iterable[Any] | None:
    """The values inside a less common container, or None for anything that is not one."""
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, (list, tuple)):
        return value
    if isinstance(value, BaseModel):
        return [*value.__dict__.values(), *(value.__pydantic_extra__ or {}).values()]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, field.name) for field in dataclasses.fields(value)]
    return None
