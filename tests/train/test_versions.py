"""Which weights sampled which tokens: span versions → calls → rows → the `sampling_versions` tensor."""

from __future__ import annotations

import pytest

from agl_proxy.recording.call_record import CallRecord, build_llm_span
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


def crossing_spans():
    """An answer that went on across a weight update: 5 tokens sampled by version 3, then 7 by
    version 4 (one choice, two segments), and a follow-up the proxy bridged from it (version 4)."""
    answer = list(range(10, 22))
    first = llm_call_span([1, 2], answer, sequence_id=1, span_id="s1", model_version="3", chain={"prompt": "rendered"})
    first.attributes["agl.choices"][0]["segments"] = [["3", 5], ["4", 7]]
    bridged = {"prompt": "bridged", "parent": "s1", "choice": 0}
    follow_up = llm_call_span([1, 2, *answer, 30], [31, 32], sequence_id=2, model_version="4", chain=bridged)
    follow_up.attributes["agl.choices"][0]["segments"] = [["4", 2]]
    return [first, follow_up, reward(1.0, sequence_id=3)]


def test_an_answer_sampled_across_an_update_is_one_response_with_two_versions() -> None:
    first, _, _ = crossing_spans()
    (call,), _ = calls_from_spans([first])
    assert call.model_version == 3  # the version the call started on
    assert call.versions == ((3, 5), (4, 7))

    (row,) = aggregate([trace_from_spans("ro-1", [first])], "transition", Limits(8, 16)).rows

    tensors = rows_to_tensors([row], Limits(8, 12), pad_token_id=0)
    assert tensors[SAMPLING_VERSIONS].tolist() == [[3] * 5 + [4] * 7]


def test_a_bridged_follow_up_keeps_the_versions_of_the_answer_its_prompt_continues() -> None:
    (row,) = aggregate([trace_from_spans("ro-1", crossing_spans())], "trajectory", Limits(8, 16)).rows

    assert list(row.response_mask) == [1] * 12 + [0] + [1, 1]
    assert row.versions == ((3, 5), (4, 7), (None, 1), (4, 2))


@pytest.mark.parametrize(
    "segments",
    [
        [["3", 5], ["4", 6]],  # 11 tokens of 12
        [["3", 5], ["4", 8]],
        [],
        "3:5,4:7",
        [["3", 5, 1], ["4", 7]],
        [["3", "5"], ["4", 7]],
        [["3", -1], ["4", 13]],
        [["3", True], ["4", 11]],
    ],
)
def test_segments_that_do_not_line_up_with_the_tokens_give_every_token_the_calls_version(segments) -> None:
    span = llm_call_span([1, 2], list(range(10, 22)), sequence_id=1, model_version="3")
    span.attributes["agl.choices"][0]["segments"] = segments

    (call,), skipped = calls_from_spans([span])

    assert (call.segments, call.versions, skipped) == (None, ((3, 12),), {})


def test_a_segment_whose_version_is_not_an_integer_is_of_unknown_version() -> None:
    span = llm_call_span([1, 2], [3, 4, 5], sequence_id=1, model_version="3")
    span.attributes["agl.choices"][0]["segments"] = [["3", 1], ["res-7", 2]]

    (call,), _ = calls_from_spans([span])

    assert call.versions == ((3, 1), (None, 2))


async def test_the_segments_the_proxy_records_reach_the_trainer_through_the_store() -> None:
    store = SQLiteStore(":memory:")
    await store.open()
    try:
        rollout = await store.start_rollout(input={"question": "2+2"})
        record = CallRecord(
            operation="chat",
            rollout_id=rollout.rollout_id,
            attempt_id=rollout.attempt.attempt_id,
            requested_model="tiny",
            stream=False,
            start_time=1.0,
        )
        record.response = {"prompt_token_ids": [1, 2], "choices": [{"index": 0, "token_ids": list(range(10, 22))}]}
        record.status_code = 200
        record.segments = {0: [("3", 5), ("4", 7)]}
        await store.add_span(build_llm_span(record))

        trace = await read_rollout(store, rollout.rollout_id)

        assert [call.versions for call in trace.calls] == [((3, 5), (4, 7))]
    finally:
        await store.close()
