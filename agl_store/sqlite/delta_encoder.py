"""The stored form of an LLM call kept as a delta of an earlier call (the scheme: `deltas.py`).

`Unpacked` splits a stored attributes skeleton and its token blob; `call_of` takes the parts a
delta is made of (prompt ids, each choice's ids, the request's messages) as a `Call`;
`encode_delta` stores a call as a `Delta` of its parent and `decode_delta` makes it whole again.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from typing import Any

import orjson

from .. import call_span
from ..packed_attributes import MIN_PACKED_LENGTH, NOT_FOUND, value_at

MESSAGES_PATH = (call_span.REQUEST, "messages")
PROMPT_PATH = [call_span.PROMPT_TOKEN_IDS]
_LITTLE_ENDIAN = sys.byteorder == "little"

Path = list[Any]


def int32_bytes(values: Any) -> bytes | None:
    """A short id list kept as JSON (under `MIN_PACKED_LENGTH`) as int32 bytes; None if not ids."""
    if type(values) is not list or not all(type(v) is int for v in values):
        return None
    try:
        ints = array("i", values)
    except OverflowError:
        return None
    if not _LITTLE_ENDIAN:
        ints.byteswap()
    return ints.tobytes()


@dataclass
class Unpacked:
    """A stored attributes skeleton and its token blob, split for delta work."""

    skeleton: dict[str, Any]
    index: list[list[Any]]
    data: bytes

    @classmethod
    def of(cls, text: bytes | str, blob: bytes | None, attributes: dict[str, Any] | None = None) -> Unpacked:
        """The stored pair split; `attributes`, the skeleton `text` is the JSON of, stands in
        for parsing `text` (it is read and copied, never changed)."""
        skeleton = orjson.loads(text) if attributes is None else attributes
        if blob is None:
            return cls(skeleton, [], b"")
        split = blob.index(b"\n")
        return cls(skeleton, orjson.loads(blob[:split]), bytes(blob[split + 1 :]))

    def entry(self, path: Path) -> list[Any] | None:
        for entry in self.index:
            if entry[0] == path:
                return entry
        return None

    def ids(self, path: Path) -> bytes | None:
        """The int32 bytes of the id list at `path`, packed or short JSON; None if it is neither."""
        entry = self.entry(path)
        if entry is not None:
            return self.data[entry[1] * 4 : (entry[1] + entry[2]) * 4]
        value = value_at(self.skeleton, path)
        return None if value is NOT_FOUND else int32_bytes(value)

    def choices(self) -> list[tuple[int, bytes]]:
        """(position, generated ids) of each choice with ids."""
        choices = self.skeleton.get(call_span.CHOICES)
        if type(choices) is not list:
            return []
        found = []
        for position in range(len(choices)):
            ids = self.ids([call_span.CHOICES, position, "token_ids"])
            if ids:
                found.append((position, ids))
        return found

    def messages(self) -> list[Any] | None:
        """The request's messages, when they are a list holding no packed ids."""
        request = self.skeleton.get(call_span.REQUEST)
        messages = request.get("messages") if type(request) is dict else None
        if type(messages) is not list:
            return None
        if any(entry[0][:2] == list(MESSAGES_PATH) for entry in self.index):
            return None
        return messages

    def blob(self) -> bytes | None:
        if not self.index:
            return None
        return orjson.dumps(self.index) + b"\n" + self.data

    def text(self) -> bytes:
        return orjson.dumps(self.skeleton)


def _with_value(root: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """A copy of `root` with `value` at `path`; only the containers on the path are copied."""
    top: dict[str, Any] = dict(root)
    node: Any = top
    for key in path[:-1]:
        child = node[key]
        node[key] = child = dict(child) if type(child) is dict else list(child)
        node = child
    node[path[-1]] = value
    return top


def _set_messages(skeleton: dict[str, Any], messages: list[Any]) -> None:
    request = dict(skeleton[call_span.REQUEST])
    request["messages"] = messages
    skeleton[call_span.REQUEST] = request


@dataclass
class Call:
    """What a delta needs of a stored call, whole: its prompt, choices and messages."""

    prompt: bytes | None
    choices: dict[int, bytes]
    messages: list[Any] | None
    _messages_json: bytes | None = field(default=None, repr=False, compare=False)

    def context(self, choice: int | None) -> bytes:
        return (self.prompt or b"") + (self.choices.get(choice, b"") if choice is not None else b"")

    def messages_json(self) -> bytes:
        """The messages' JSON, made once (the writer compares calls by it)."""
        if self._messages_json is None:
            self._messages_json = orjson.dumps(self.messages)
        return self._messages_json


@dataclass
class Delta:
    base_pk: int
    stamp: bytes
    choice: int | None
    prefix: int
    messages: int
    depth: int


def call_of(unpacked: Unpacked, messages_json: bytes | None = None) -> Call | None:
    """The call parts of a whole span's attributes; None for a span that is not a call.
    `messages_json`, when given, is the JSON of the request's messages in `unpacked`."""
    prompt = unpacked.ids(PROMPT_PATH)
    messages = unpacked.messages()
    if prompt is None and messages is None:
        return None
    return Call(prompt, dict(unpacked.choices()), messages, messages_json if messages is not None else None)


def encode_delta(unpacked: Unpacked, call: Call, delta: Delta) -> tuple[bytes, bytes | None, bytes]:
    """The stored (attributes text, blob, delta JSON) of `call` as `delta`."""
    prompt = call.prompt or b""
    tail = prompt[delta.prefix * 4 :]
    prompt_entry = unpacked.entry(PROMPT_PATH)
    prompt_paths: list[Path] = []
    index: list[list[Any]] = []
    for entry in unpacked.index:
        if prompt_entry is not None and entry[1:] == prompt_entry[1:]:
            if entry[0] != PROMPT_PATH:
                prompt_paths.append(entry[0])
            continue
        index.append(entry)
    skeleton = dict(unpacked.skeleton)
    if call.prompt is not None:
        skeleton[call_span.PROMPT_TOKEN_IDS] = None
        index.append([PROMPT_PATH, 0, 0])  # placed after the repack below
    if delta.messages:
        _set_messages(skeleton, (call.messages or [])[delta.messages :])
    # The whole prompt's ids are dropped from the data; the tail goes last.
    stored = repacked(skeleton, index[:-1] if call.prompt is not None else index, unpacked.data)
    if call.prompt is not None:
        stored.index.append([PROMPT_PATH, len(stored.data) // 4, len(tail) // 4])
        stored.data += tail
    info = {
        "choice": delta.choice,
        "prefix": delta.prefix if call.prompt is not None else None,
        "messages": delta.messages,
        "prompt_paths": prompt_paths,
        "depth": delta.depth,
    }
    return stored.text(), stored.blob(), orjson.dumps(info)


def repacked(skeleton: dict[str, Any], index: list[list[Any]], data: bytes) -> Unpacked:
    """`index` over a copy of `data` holding only the ranges it names."""
    moved: dict[tuple[int, int], int] = {}
    parts: list[bytes] = []
    size = 0
    new_index = []
    for path, offset, count in index:
        where = moved.get((offset, count))
        if where is None:
            where = moved[(offset, count)] = size
            parts.append(data[offset * 4 : (offset + count) * 4])
            size += count
        new_index.append([path, where, count])
    return Unpacked(skeleton, new_index, b"".join(parts))


def decode_delta(text: bytes | str, blob: bytes | None, info: dict[str, Any], parent: Call) -> tuple[Unpacked, Call]:
    """A stored delta back as whole attributes, and its call parts."""
    stored = Unpacked.of(text, blob)
    skeleton = stored.skeleton
    prompt: bytes | None = None
    index = stored.index
    data = stored.data
    if info["prefix"] is not None:
        entry = stored.entry(PROMPT_PATH)
        assert entry is not None
        tail = data[entry[1] * 4 : (entry[1] + entry[2]) * 4]
        prompt = parent.context(info["choice"])[: info["prefix"] * 4] + tail
        if entry[1] * 4 + len(tail) == len(data):
            data = data[: entry[1] * 4]
        index = [e for e in index if e is not entry]
        paths = [PROMPT_PATH, *info["prompt_paths"]]
        if len(prompt) // 4 >= MIN_PACKED_LENGTH:
            where = len(data) // 4
            data += prompt
            index.extend([path, where, len(prompt) // 4] for path in paths)
        else:  # as `pack_attributes` keeps a short list: JSON
            ints = array("i")
            ints.frombytes(prompt)
            if not _LITTLE_ENDIAN:
                ints.byteswap()
            for path in paths:
                skeleton = _with_value(skeleton, path, ints.tolist())
    messages = None
    if info["messages"]:
        messages = (parent.messages or [])[: info["messages"]] + list(skeleton[call_span.REQUEST]["messages"])
        skeleton = dict(skeleton)
        _set_messages(skeleton, messages)
    whole = Unpacked(skeleton, index, data)
    if messages is None:
        messages = whole.messages()
    return whole, Call(prompt, dict(whole.choices()), messages)
