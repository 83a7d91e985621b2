"""Compact storage of span attributes: int arrays as binary, everything else as JSON.

Token ids dominate a span's size, and as JSON text they take about 2.4 times the bytes of
a binary int32 array. `pack_attributes` moves every list of at least `MIN_PACKED_LENGTH`
ints (bools excluded), at any depth, into one little-endian int32 blob and leaves a small
placeholder in the JSON; `unpack_attributes` puts plain lists back, so readers get exactly
what was stored. Lists with a value outside int32 stay JSON.

Placeholders are one-key objects whose key starts with NUL, which JSON from the wild does
not use; an object that does use such a key is escaped, so any value round-trips.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any, Dict, Optional, Tuple

import orjson

MIN_PACKED_LENGTH = 8
"""Shorter int lists stay JSON: a placeholder would not be smaller."""

_INTS_KEY = "\x00ints"  # {"\x00ints": [offset, count]}: count ints of the blob from offset
_ESCAPE_KEY = "\x00dict"  # {"\x00dict": {...}}: an object whose own keys start with NUL
_LITTLE_ENDIAN = sys.byteorder == "little"


def pack_attributes(attributes: Dict[str, Any]) -> Tuple[bytes, Optional[bytes]]:
    """Encode attributes as (JSON skeleton, int32 blob).

    The blob is None when the skeleton is the plain JSON of `attributes`, so reading it
    back needs no walk. Raises TypeError (from orjson) for values that are not JSON.
    """
    ints = array("i")
    state = _PackState(ints)
    skeleton = state.pack(attributes)
    if not state.changed:
        return orjson.dumps(attributes), None
    if not _LITTLE_ENDIAN:
        ints.byteswap()
    return orjson.dumps(skeleton), ints.tobytes()


def unpack_attributes(skeleton: bytes, blob: Optional[bytes]) -> Dict[str, Any]:
    """Decode what `pack_attributes` produced: int arrays come back as lists of ints."""
    value = orjson.loads(skeleton)
    if blob is None:
        return value
    ints = array("i")
    ints.frombytes(blob)
    if not _LITTLE_ENDIAN:
        ints.byteswap()
    return _unpack(value, ints)


class _PackState:
    """One packing pass: the blob being filled and whether any placeholder was written."""

    def __init__(self, ints: array) -> None:
        self.ints = ints
        self.changed = False

    def pack(self, value: Any) -> Any:
        kind = type(value)
        if kind is dict:
            packed = {key: self.pack(item) for key, item in value.items()}
            if any(type(key) is str and key.startswith("\x00") for key in value):
                self.changed = True
                return {_ESCAPE_KEY: packed}
            return packed
        if kind is list or kind is tuple:
            if len(value) >= MIN_PACKED_LENGTH and type(value[0]) is int and set(map(type, value)) == {int}:
                try:
                    converted = array("i", value)
                except OverflowError:
                    return list(value)
                self.changed = True
                offset = len(self.ints)
                self.ints.extend(converted)
                return {_INTS_KEY: [offset, len(converted)]}
            return [self.pack(item) for item in value]
        return value


def _unpack(value: Any, ints: array) -> Any:
    kind = type(value)
    if kind is dict:
        if len(value) == 1:
            if _INTS_KEY in value:
                offset, count = value[_INTS_KEY]
                return ints[offset : offset + count].tolist()
            if _ESCAPE_KEY in value:
                return {key: _unpack(item, ints) for key, item in value[_ESCAPE_KEY].items()}
        return {key: _unpack(item, ints) for key, item in value.items()}
    if kind is list:
        return [_unpack(item, ints) for item in value]
    return value
