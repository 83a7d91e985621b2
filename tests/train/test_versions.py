"""Which weights sampled which tokens: span versions → calls → rows → the `sampling_versions` tensor."""

from __future__ import annotations

import pytest

from agl_store.sqlite import SQLiteStore
from agl_train.algo.tensorize import SAMPLING_VERSIONS, UNKNOWN_VERSION, rows_to_tensors
from agl_train.core.aggregate import Limits, aggregate
from agl_train.core.traces import calls_from_spans, read_rollout, trace_from_spans
from agl_train.core.versions import joined, truncated, version_of

from .builders import llm_call_span, reward


@pytest.mark.parametrize(
    "value, version",
    [
        ("3", 3),
        (3, 3),
        (" 12 ", 12),
        (None, None),
        ("res-7", None),
        ("", None),
        ("-1", None),
        (-1, None),
        (True, None),
        (2.0, None),
    ],
)
def test_a_span_names_its_weight_version_as_an_integer_or_the_version_is_unknown(value, version) -> None:
    assert version_of(value) == version


def test_segments_join_neighbours_of_one_version_and_truncate_at_a_token_count() -> None:
    assert joined([(1, 2), (1, 3), (None, 0), (2, 1), (None, 1)]) == ((1, 5), (2, 1), (None, 1))
    assert truncated(((1, 5), (2, 1), (None, 1)), 6) == ((1, 5), (2, 1))
    assert truncated(((1, 5), (2, 1)), 3) == ((1, 3),)


def agent_spans(rollout_id: str = "ro-1", attempt_id: str = "at-1"):
    """Two turns of one agent: the second prompt continues the first (prompt + answer + one tool
    token), and an update landed between them (version 2, then 3)."""
    ids = {"rollout_id": rollout_id, "attempt_id": attempt_id}
    return [
        llm_call_span([1, 2], [3, 4], sequence_id=1, model_version="2", **ids),
        llm_call_span([1, 2, 3, 4, 5], [6], sequence_id=2, model_version="3", **ids),
        reward(1.0, sequence_id=3, **ids),
    ]


def test_each_trained_token_of_a_row_carries_the_version_of_the_call_that_sampled_it() -> None:
    calls, _ = calls_from_spans(agent_spans())
    assert [call.model_version for call in calls] == [2, 3]

    (row,) = aggregate([trace_from_spans("ro-1", agent_spans())], "trajectory", Limits(8, 16)).rows

    assert list(row.response_ids) == [3, 4, 5, 6]
    assert list(row.response_mask) == [1, 1, 0, 1]
    assert row.versions == ((2, 2), (None, 1), (3, 1))  # the inserted tool token was sampled by no one


def test_a_cut_row_keeps_the_versions_of_the_tokens_it_keeps() -> None:
    (row,) = aggregate([trace_from_spans("ro-1", agent_spans())], "trajectory", Limits(8, 3)).rows
    assert row.truncated and row.versions == ((2, 2), (None, 1))


def test_a_transition_row_carries_its_calls_version_and_a_span_without_one_none() -> None:
    spans = [llm_call_span([1], [2, 3], sequence_id=1, model_version="5"), llm_call_span([1, 2, 3], [4], sequence_id=2)]
    rows = aggregate([trace_from_spans("ro-1", spans)], "transition", Limits(8, 16)).rows
    assert [row.versions for row in rows] == [((5, 2),), ((None, 1),)]


def test_the_batch_holds_each_response_tokens_version_and_unknown_elsewhere() -> None:
    (row,) = aggregate([trace_from_spans("ro-1", agent_spans())], "trajectory", Limits(8, 6)).rows

    tensors = rows_to_tensors([row], Limits(8, 6), pad_token_id=0)

    assert tensors[SAMPLING_VERSIONS].tolist() == [[2, 2, UNKNOWN_VERSION, 3, UNKNOWN_VERSION, UNKNOWN_VERSION]]


async def test_the_trainers_read_of_a_real_store_brings_the_versions() -> None:
    store = SQLiteStore(":memory:")
    await store.open()
    try:
        rollout = await store.start_rollout(input={"question": "2+2"})
        for span in agent_spans(rollout.rollout_id, rollout.attempt.attempt_id):
            await store.add_span(span)

        trace = await read_rollout(store, rollout.rollout_id)

        assert [call.model_version for call in trace.calls] == [2, 3]
    finally:
        await store.close()
