"""Rollout summaries: what the list shows, and which of them may be kept between refreshes."""

from __future__ import annotations

from agl_store.models import Attempt, AttemptedRollout
from agl_train.view.summaries import RolloutFilter, SummaryCache, list_rollouts

from .rollouts import llm_call_span, write_rollout


def rollout(rollout_id: str, status: str, end_time: float | None = None) -> AttemptedRollout:
    attempt = Attempt(rollout_id=rollout_id, attempt_id="at-1", sequence_id=1, start_time=1.0)
    return AttemptedRollout(
        rollout_id=rollout_id, input=None, start_time=1.0, end_time=end_time, status=status, attempt=attempt
    )


def test_only_finished_rollouts_are_cached_and_the_cache_is_bounded() -> None:
    cache = SummaryCache(max_entries=2)
    running, done = rollout("ro-run", "running"), rollout("ro-done", "succeeded", end_time=2.0)

    cache.put(running, {"n_calls": 1})
    cache.put(done, {"n_calls": 2})

    assert (cache.get(running), cache.get(done)) == (None, {"n_calls": 2})
    assert cache.get(rollout("ro-done", "succeeded", end_time=3.0)) is None  # ended again: another state
    cache.put(rollout("ro-a", "failed", 2.0), {})
    cache.put(rollout("ro-b", "failed", 2.0), {})
    assert cache.get(done) is None


async def test_a_running_rollout_is_summarised_afresh_on_every_refresh(store) -> None:
    calls = [{"prompt": [1, 2], "response": [3]}]
    running = await write_rollout(store, calls, finish=False)
    cache = SummaryCache()
    (first,) = (await list_rollouts(store, RolloutFilter(), cache))["items"]

    await store.add_span(llm_call_span(running.rollout_id, running.attempt_id, [1, 2, 3, 4], [5], 10.0))
    (second,) = (await list_rollouts(store, RolloutFilter(), cache))["items"]

    assert (first["status"], first["n_calls"], second["n_calls"], second["tokens_in"]) == ("running", 1, 2, 6)
