"""Compact storage of span attributes: int arrays as binary, everything else as JSON.

Token ids dominate a span's size, and as JSON text they take about 2.4 times the bytes of
a binary int32 array. `pack_attributes` moves every list of at least `MIN_PACKED_LENGTH`
ints (bools excluded), at any depth, into one little-endian int32 blob; `unpack_attributes`
puts plain lists back, so readers get exactly what was stored. Lists with a value outside
int32 stay JSON.

The blob starts with an index, one line of JSON `[[path, offset, count], ...]` naming where
each array sits (a path is a list of object keys and list indexes), then the int32 data.
The JSON text keeps `null` at those places. Reading therefore visits only the packed
arrays, not every value, and no in-band marker can collide with user data.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any

import orjson

from .bounds import MAX_JSON_DEPTH, too_deep
from .errors import InvalidInputError

MIN_PACKED_LENGTH = 8
"""Shorter int lists stay JSON: packing would not make them smaller."""

Path = tuple[str | int, ...]
_CONTAINERS: frozenset[type] = frozenset({dict, list, tuple})
_LITTLE_ENDIAN = sys.byteorder == "little"
Found = tuple[Path, Any, tuple[bytes, bytes]]
"""A packable list found: its path, the list, its JSON and its int32 bytes."""


def pack_attributes(attributes: dict[str, Any]) -> tuple[bytes, bytes | None]:
    """Encode attributes as (JSON text, blob).

    The blob is None when nothing was packed: the text is then the plain JSON. Raises
    TypeError (from orjson) for values that are not JSON, such as ints beyond 64 bits, and
    InvalidInputError for attributes nested deeper than `bounds.MAX_JSON_DEPTH` (checked on
    this walk, which looks at every list anyway).
    """
    skeleton, blob = pack_skeleton(attributes)
    return orjson.dumps(skeleton), blob


def pack_skeleton(attributes: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
    """`pack_attributes` but for the JSON text: the skeleton to dump (`attributes` itself
    when nothing was packed; else a copy of the containers on the packed paths, sharing the
    rest) and the blob."""
    found: list[Found] = []
    _find_int_lists(attributes, (), found, MAX_JSON_DEPTH - 1)
    if not found:
        return attributes, None

    parts: list[bytes] = []
    size = 0
    index: list[tuple[Path, int, int]] = []
    # One array named twice (the proxy's prompt ids: in the response and as `agl.*`) is
    # stored once. By content, not identity: validation upstream copies the lists.
    placed: dict[bytes, tuple[int, int]] = {}  # the list's JSON -> (offset, count)
    for path, _, (text, data) in found:
        where = placed.get(text)
        if where is None:
            where = placed[text] = (size, len(data) // 4)
            parts.append(data)
            size += len(data) // 4
        index.append((path, *where))
    skeleton = _without(attributes, [path for path, _, _ in found])
    return skeleton, orjson.dumps(index) + b"\n" + b"".join(parts)


def unpack_attributes(text: bytes, blob: bytes | None) -> dict[str, Any]:
    """Decode what `pack_attributes` produced: int arrays come back as lists of ints."""
    value = orjson.loads(text)
    return value if blob is None else fill_packed(value, blob)


def fill_packed(value: dict[str, Any], blob: bytes, *, arrays: bool = False) -> dict[str, Any]:
    """Put the int arrays of `blob` back into `value` (the JSON text's skeleton), in place.

    The store client calls this on spans that came over the wire in packed form, so that
    neither the server nor pydantic handles the token ids one by one. With `arrays` the
    arrays stay `array('i')` (a copy of their bytes, no Python int per id): for readers that
    only compare and copy token ids, such as the trainer.
    """
    # orjson writes newlines inside strings as \n, so the first raw newline ends the index.
    split = blob.index(b"\n")
    ints = array("i")
    ints.frombytes(memoryview(blob)[split + 1 :])  # a view: the int32 data is copied once, here
    if not _LITTLE_ENDIAN:
        ints.byteswap()
    decoded: dict[int, list[int]] = {}  # offset -> list: an array named twice is decoded once
    for path, offset, count in orjson.loads(blob[:split]):
        parent: Any = value
        for key in path[:-1]:
            parent = parent[key]
        if arrays:
            parent[path[-1]] = ints[offset : offset + count]
            continue
        known = decoded.get(offset)
        if known is not None and len(known) == count:
            parent[path[-1]] = known.copy()  # equal, but not the same object: callers may mutate
        else:
            parent[path[-1]] = decoded[offset] = ints[offset : offset + count].tolist()
    return value


def check_packed_batch(skeletons: Sequence[dict[str, Any]], blobs: Sequence[bytes | None]) -> None:
    """Raise InvalidInputError unless there is one blob (or None) per span and each fits its
    span's attributes (`check_packed`); the message names the first that does not."""
    if len(skeletons) != len(blobs):
        raise InvalidInputError(f"{len(skeletons)} spans but {len(blobs)} packed_tokens entries")
    for index, (skeleton, blob) in enumerate(zip(skeletons, blobs, strict=False)):
        if blob is None:
            continue
        try:
            check_packed(skeleton, blob)
        except ValueError as exc:
            raise InvalidInputError(f"packed_tokens[{index}] does not fit spans[{index}]: {exc}") from None


def check_packed(skeleton: dict[str, Any], blob: bytes) -> None:
    """Raise ValueError unless `blob` fits `skeleton`: a well-formed index whose every path
    ends at a `null` in the skeleton and whose arrays lie inside the int32 data.

    The server runs this on blobs that clients packed, so a stored span always unpacks.
    """
    split = blob.find(b"\n")
    if split < 0:
        raise ValueError("no index line")
    data_bytes = len(blob) - split - 1
    if data_bytes % 4:
        raise ValueError("int32 data is not a multiple of 4 bytes")
    try:
        index = orjson.loads(blob[:split])
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"index is not JSON: {exc}") from None
    if type(index) is not list:
        raise ValueError("index is not a list")
    for entry in index:
        if type(entry) is not list or len(entry) != 3:
            raise ValueError(f"index entry {entry!r} is not [path, offset, count]")
        path, offset, count = entry
        if type(offset) is not int or type(count) is not int or offset < 0 or count < 0:
            raise ValueError(f"index entry {entry!r}: offset and count must be ints >= 0")
        if (offset + count) * 4 > data_bytes:
            raise ValueError(f"index entry {entry!r} reaches past the int32 data")
        if type(path) is not list or not path:
            raise ValueError(f"index entry {entry!r}: the path must be a non-empty list")
        parent = value_at(skeleton, path)
        if parent is NOT_FOUND:
            raise ValueError(f"index path {path!r} is not in the attributes")
        if parent is not None:
            raise ValueError(f"index path {path!r} does not end at a null")


NOT_FOUND: Any = object()
"""What `value_at` returns for a path that is not in the value."""


def value_at(root: Any, path: Sequence[Any]) -> Any:
    """The value at `path` (dict keys and list indices) inside `root`, or `NOT_FOUND`."""
    value = root
    for key in path:
        if type(value) is dict and type(key) is str and key in value:
            value = value[key]
        elif type(value) is list and type(key) is int and 0 <= key < len(value):
            value = value[key]
        else:
            return NOT_FOUND
    return value


_DIGITS = b"0123456789,-"


def _packable(values: Any, found: list[Found]) -> tuple[bytes, bytes] | None:
    """(JSON text, little-endian int32 bytes) of `values`, or None when it must stay JSON.

    A list is packed when its JSON is only ints (digits, commas and minus signs between its
    brackets: no bool, float, null, string or nested list) that fit int32, so its readers get
    the same list of ints either way. orjson and struct do this in C, where a Python check
    of each item's type took as long as both.
    """
    if len(values) < MIN_PACKED_LENGTH or type(values[0]) is not int:
        return None
    for _, seen, (text, data) in found:  # the proxy names one id list twice: convert it once
        if seen is values:
            return text, data
    try:
        text = orjson.dumps(values)
    except TypeError:
        return None  # not JSON (an int beyond 64 bits, an object): the whole dump says so
    if text.translate(None, _DIGITS) != b"[]":
        return None
    for _, _, (seen_text, data) in found:  # an equal list: equal JSON, equal ints
        if seen_text == text:
            return text, data
    try:
        return text, struct.pack(f"<{len(values)}i", *values)
    except struct.error:
        return None  # beyond int32: JSON keeps it exact


def _find_int_lists(container: Any, path: Path, found: list[Found], room: int) -> None:
    """Append (path, list, (JSON, int32 bytes)) for every packable list inside `container`,
    whose children may nest `room` more levels."""
    items = container.items() if type(container) is dict else enumerate(container)
    for key, item in items:
        kind = type(item)
        if kind is dict or kind is list or kind is tuple:
            if room == 0:
                raise too_deep("attributes")
            if kind is dict:
                # Only a container inside can hold a list (or be too deep): most chat
                # messages hold none.
                if not _CONTAINERS.isdisjoint(map(type, item.values())):
                    _find_int_lists(item, (*path, key), found, room - 1)
                continue
            packed = _packable(item, found)
            if packed is not None:
                found.append(((*path, key), item, packed))
            elif not _CONTAINERS.isdisjoint(map(type, item)):
                _find_int_lists(item, (*path, key), found, room - 1)


def _without(attributes: dict[str, Any], paths: list[Path]) -> dict[str, Any]:
    """A copy of `attributes` with None at each path; only containers on a path are copied."""
    root: dict[str, Any] = dict(attributes)
    copies: dict[tuple[Any, ...], Any] = {(): root}
    for path in paths:
        original: Any = attributes
        copy: Any = root
        for depth, key in enumerate(path[:-1], start=1):
            original = original[key]
            child = copies.get(path[:depth])
            if child is None:
                child = copies[path[:depth]] = dict(original) if type(original) is dict else list(original)
                copy[key] = child
            copy = child
        copy[path[-1]] = None
    return root
