"""The renderings of a bridge's head (the system message and the dummy user turn), kept so that
a bridged call renders once.

A bridge renders its small request (head, echoed answer, new messages) and needs to know where
the new messages start. The head is the same for every call of an agent with the same system
message, tools and other request fields, so its ids are kept, keyed by the digest of the whole
head request as the engine would get it: any field that differs is another entry. Bounded: the
least recently used entries are dropped past `max_entries` or `max_ids` ids in all (8 bytes each).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from .digests import Digest, digest

DEFAULT_MAX_ENTRIES = 256
DEFAULT_MAX_IDS = 1_000_000


def head_key(deployment_key: str, head_request: Mapping[str, Any]) -> Digest:
    """The cache key of a head request sent to a deployment (`Deployment.key`)."""
    return digest([deployment_key, head_request])


class ChainHeads:
    """Head renderings (prompt ids) by `head_key`, least recently used dropped first."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, max_ids: int = DEFAULT_MAX_IDS) -> None:
        if max_entries < 1 or max_ids < 1:
            raise ValueError(f"max_entries and max_ids must be >= 1, got {max_entries} and {max_ids}")
        self.max_entries = max_entries
        self.max_ids = max_ids
        self.size = 0
        """Ids kept in all."""
        self._ids: OrderedDict[Digest, array[int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, key: Digest) -> array[int] | None:
        ids = self._ids.get(key)
        if ids is not None:
            self._ids.move_to_end(key)
        return ids

    def put(self, key: Digest, ids: Sequence[int]) -> None:
        """Keep `ids` under `key`; a head longer than `max_ids` is not kept."""
        old = self._ids.pop(key, None)
        if old is not None:
            self.size -= len(old)
        if len(ids) > self.max_ids:
            return
        self._ids[key] = array("l", ids)
        self.size += len(ids)
        while len(self._ids) > self.max_entries or self.size > self.max_ids:
            _, dropped = self._ids.popitem(last=False)
            self.size -= len(dropped)
