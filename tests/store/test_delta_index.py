"""The delta writer's index of recent calls (`agl_store/sqlite/delta_index.py`): its byte
bound counts what it holds, after forgetting too."""

from __future__ import annotations

from agl_store.sqlite.delta_encoder import Call
from agl_store.sqlite.delta_index import Candidate, DeltaIndex


def candidate(pk: int, ids: int) -> Candidate:
    """A remembered call of `ids` prompt ids (4 bytes each) and nothing else."""
    return Candidate.of(pk, b"stamp", Call(bytes(4 * ids), {}, None), depth=0)


def test_forgetting_a_call_frees_its_bytes_in_the_bound() -> None:
    index = DeltaIndex(max_bytes=1000)
    first, second = ("rollout", "a"), ("rollout", "b")
    index.remember(first, [candidate(1, 100), candidate(2, 100)])
    assert index.total == 800
    index.forget(first, 1)  # a stale parent, say
    assert index.total == 400
    index.remember(second, [candidate(3, 100)])
    assert index.total == 800
    assert list(index.attempts) == [first, second]  # within the bound: nothing evicted
    index.forget(second, 3)
    index.forget(first, 2)
    assert index.total == 0
