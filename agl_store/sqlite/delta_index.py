"""The in-memory index of each attempt's recent calls, and the choice of a new call's parent
among them (`best_parent`); a cache only, as `deltas.py` says why."""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from .delta_encoder import Call, Delta

RECENT_CALLS = 8
"""Calls per attempt the index remembers (each choice's context counts as one)."""
MAX_ATTEMPTS = 4096
"""Attempts the index remembers, least recently written first out."""


def _shared_bytes(whole: bytes, start: int, part: bytes) -> int:
    """How many leading ids of `part` `whole` has from byte `start`: a binary search of
    memory comparisons, the first of which settles the usual case (all of them)."""
    n = min(len(whole) - start, len(part)) // 4
    if not n or not whole.startswith(part[:4], start):
        return 0
    if whole.startswith(part[: n * 4], start):
        return n
    low, high = 0, n - 1
    while low < high:
        middle = (low + high + 1) // 2
        if whole.startswith(part[: middle * 4], start):
            low = middle
        else:
            high = middle - 1
    return low


def _shared_messages(call: Call, other: Candidate) -> int:
    """How many leading messages are the same JSON in `call` and a remembered call."""
    mine, count = call.messages, other.message_count
    if not mine or not count or other.messages_json is None:
        return 0
    theirs_json = other.messages_json
    if count <= len(mine):
        # The usual case, a conversation going on: all of `theirs` is a prefix of `mine`.
        # Then the JSON of `mine` starts with that of `theirs` but its "]", and the next
        # byte ends a value: the first `count` messages are the same JSON values.
        mine_json = call.messages_json()
        end = len(theirs_json) - 1
        if mine_json[end : end + 1] in (b",", b"]") and mine_json.startswith(theirs_json[:end]):
            return count
    theirs = orjson.loads(theirs_json)  # the index keeps JSON, never a caller's objects
    if mine[0] != theirs[0]:
        return 0
    n = min(len(mine), len(theirs))
    if mine[:n] != theirs[:n]:
        low, high = 0, n - 1
        while low < high:
            middle = (low + high + 1) // 2
            if mine[:middle] == theirs[:middle]:
                low = middle
            else:
                high = middle - 1
        n = low
    # Python's == takes 1 for 1.0 and True; the JSON text does not.
    if n and orjson.dumps(mine[:n]) != orjson.dumps(theirs[:n]):
        return 0
    return n


@dataclass
class Candidate:
    """A stored call the index remembers, with its row's `stamp` and its depth of deltas.

    It holds bytes only (ids, and the messages as JSON): a call's messages are often the
    caller's own list, which an agent loop goes on appending to after the call is stored.
    """

    pk: int
    stamp: bytes
    prompt: bytes | None
    choices: dict[int, bytes]
    messages_json: bytes | None
    message_count: int
    depth: int
    size: int = field(init=False)
    """The bytes the index holds for it."""
    reach: int = field(init=False)
    """The most ids a prompt could share with its contexts (`best_parent` tries the longest first)."""

    def __post_init__(self) -> None:
        prompt = len(self.prompt or b"")
        self.size = prompt + sum(map(len, self.choices.values())) + len(self.messages_json or b"")
        self.reach = (prompt + max(map(len, self.choices.values()), default=0)) // 4

    @classmethod
    def of(cls, pk: int, stamp: bytes, call: Call, depth: int) -> Candidate:
        if call.messages is None:
            return cls(pk, stamp, call.prompt, call.choices, None, 0, depth)
        return cls(pk, stamp, call.prompt, call.choices, call.messages_json(), len(call.messages), depth)


@dataclass
class DeltaIndex:
    """Recent calls of recently written attempts, their whole ids and messages, for finding a
    new call's parent.

    Lives in the writer's thread; a cache only (see `deltas.py`), bounded by
    `RECENT_CALLS` per attempt and `max_bytes` in all (least recently written attempts go).
    """

    max_bytes: int = 256 * 1024 * 1024
    attempts: OrderedDict[tuple[str, str], list[Candidate]] = field(default_factory=OrderedDict)
    sizes: dict[tuple[str, str], int] = field(default_factory=dict)
    total: int = 0

    def candidates(self, key: tuple[str, str]) -> list[Candidate]:
        found = self.attempts.get(key)
        if found is None:
            return []
        self.attempts.move_to_end(key)
        return found

    def remember(self, key: tuple[str, str], new: list[Candidate]) -> None:
        known = self.attempts.setdefault(key, [])
        self.attempts.move_to_end(key)
        known.extend(new)
        del known[:-RECENT_CALLS]
        self._measure(key, known)
        while (self.total > self.max_bytes or len(self.attempts) > MAX_ATTEMPTS) and len(self.attempts) > 1:
            evicted, _ = self.attempts.popitem(last=False)
            self.total -= self.sizes.pop(evicted, 0)

    def forget(self, key: tuple[str, str], pk: int) -> None:
        known = self.attempts.get(key)
        if known is not None:
            known[:] = [candidate for candidate in known if candidate.pk != pk]
            self._measure(key, known)

    def _measure(self, key: tuple[str, str], known: list[Candidate]) -> None:
        """`total` and `sizes` after `key`'s calls changed to `known`."""
        size = sum(candidate.size for candidate in known)
        self.total += size - self.sizes.get(key, 0)
        self.sizes[key] = size


_BY_REACH = operator.attrgetter("reach")


def best_parent(call: Call, candidates: Sequence[Candidate]) -> Delta | None:
    """The candidate sharing the longest prompt prefix (then the most messages) with `call`;
    None when none shares anything."""
    prompt = call.prompt or b""
    best: tuple[int, int, int] | None = None
    chosen: Delta | None = None
    first = prompt[:4]
    # Longest context first: once one shares more ids than the next could hold, the rest
    # cannot win, and a conversation's latest call usually settles it alone.
    for candidate in sorted(candidates, key=_BY_REACH, reverse=True):
        if best is not None and min(candidate.reach, len(prompt) // 4) < best[0]:
            break
        theirs = candidate.prompt or b""
        shared, choice = (_shared_bytes(prompt, 0, theirs) if first and theirs.startswith(first) else 0), None
        if theirs and shared * 4 == len(theirs):  # the whole prompt: then how much of a choice
            best_more = 0
            for position, ids in candidate.choices.items():
                more = _shared_bytes(prompt, len(theirs), ids)
                if more > best_more:
                    choice, best_more = position, more
            shared += best_more
        messages = _shared_messages(call, candidate)
        score = (shared, messages, candidate.pk)
        if (shared or messages) and (best is None or score > best):
            best = score
            chosen = Delta(candidate.pk, candidate.stamp, choice, shared, messages, candidate.depth + 1)
    return chosen
