"""The trace aggregator: transition rows, trajectory merging, limits and metrics."""

from __future__ import annotations

from array import array
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_train.algo.tensorize import rows_to_tensors
from agl_train.core.aggregate import (
    METRIC_DROPPED_MARKED,
    METRIC_TRUNCATED,
    Limits,
    aggregate,
    get_aggregator,
    limits_for_level,
    trajectory_rows,
    transition_rows,
)
from agl_train.core.traces import LLMCall

from .builders import call, trace

WIDE = Limits(max_prompt_length=100, max_response_length=100)

# A three-call tool agent: call 2 extends call 1 (a tool result [20, 21] inserted), call 3
# re-renders the history (token 2 became 9), so the prefix breaks there.
SYSTEM_USER = [1, 2, 3]
CALL_1 = call(SYSTEM_USER, [10, 11], logprobs=[-0.1, -0.2])
CALL_2 = call(SYSTEM_USER + [10, 11] + [20, 21], [12], logprobs=[-0.3])
CALL_3 = call([1, 9, 3, 10, 11, 20, 21, 12, 22], [13, 14], logprobs=[-0.4, -0.5])


def test_trajectory_merges_calls_and_masks_inserted_tokens_then_starts_a_row_where_the_prefix_breaks() -> None:
    rows, breaks = trajectory_rows(trace("ro-1", [CALL_1, CALL_2, CALL_3], reward_value=0.5), WIDE)

    assert len(rows) == 2
    first, second = rows
    assert first.prompt_ids == [1, 2, 3]
    assert first.response_ids == [10, 11, 20, 21, 12]
    assert first.response_mask == [1, 1, 0, 0, 1]
    assert first.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert (first.turn_index, first.n_calls, first.reward) == (0, 2, 0.5)
    assert second.prompt_ids == CALL_3.prompt_ids
    assert (second.response_ids, second.response_mask, second.turn_index) == ([13, 14], [1, 1], 2)

    (record,) = breaks
    assert (record.turn_index, record.diverge_at, record.kind) == (2, 1, "template")
    assert "prefix broke at token 1" in record.describe()


def test_the_choices_of_an_n_call_are_siblings_not_broken_prefixes() -> None:
    first = LLMCall(prompt_ids=[1, 2], response_ids=[3], span_id="s1", choice_index=0)
    second = LLMCall(prompt_ids=[1, 2], response_ids=[4], span_id="s1", choice_index=1)
    follow_up = LLMCall(prompt_ids=[1, 2, 4, 5], response_ids=[6], span_id="s2")

    rows, breaks = trajectory_rows(trace("ro-1", [first, second, follow_up]), WIDE)

    assert [(r.response_ids, r.response_mask) for r in rows] == [([3], [1]), ([4, 5, 6], [1, 0, 1])]
    assert breaks == []


def test_transition_makes_one_row_per_call() -> None:
    rows, breaks = transition_rows(trace("ro-1", [CALL_1, CALL_2, CALL_3]), WIDE)

    assert [r.turn_index for r in rows] == [0, 1, 2]
    assert [r.response_ids for r in rows] == [[10, 11], [12], [13, 14]]
    assert all(r.response_mask == [1] * len(r.response_ids) for r in rows)
    assert breaks == []


def test_a_row_whose_initial_prompt_is_over_the_limit_is_marked_not_cut(caplog: pytest.LogCaptureFixture) -> None:
    aggregation = aggregate([trace("ro-1", [CALL_1, CALL_2])], "trajectory", Limits(2, 100))

    # Every row dropped: the step trains nothing, and the warning names the limit to raise.
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "1 of 1 training rows are dropped" in warning and "up to 3 tokens" in warning
    assert "agentlightning.trace_aggregator.trajectory_max_prompt_length = 2" in warning

    (row,) = aggregation.rows
    assert row.is_drop and not row.truncated
    assert row.prompt_ids == [1, 2, 3]
    assert aggregation.metrics[METRIC_DROPPED_MARKED] == 1
    assert aggregation.metrics[METRIC_TRUNCATED] == 0


def test_everything_after_the_initial_prompt_is_truncated_to_the_response_limit() -> None:
    aggregation = aggregate([trace("ro-1", [CALL_1, CALL_2])], "trajectory", Limits(100, 3))

    (row,) = aggregation.rows
    assert (row.response_ids, row.response_mask, row.logprobs) == ([10, 11, 20], [1, 1, 0], [-0.1, -0.2, 0.0])
    assert row.truncated and not row.is_drop
    assert aggregation.metrics[METRIC_TRUNCATED] == 1
    assert aggregation.metrics[METRIC_DROPPED_MARKED] == 0


def test_transition_uses_the_same_mark_and_truncate_rules_per_call() -> None:
    aggregation = aggregate([trace("ro-1", [CALL_1, CALL_2, CALL_3])], "transition", Limits(5, 1))

    assert [(r.is_drop, r.truncated) for r in aggregation.rows] == [(False, True), (True, False), (True, True)]
    assert aggregation.metrics[METRIC_DROPPED_MARKED] == 2
    assert aggregation.metrics[METRIC_TRUNCATED] == 2


def test_a_call_without_logprobs_leaves_its_row_without_logprobs() -> None:
    rows, _ = trajectory_rows(trace("ro-1", [CALL_1, call(CALL_2.prompt_ids, [12])]), WIDE)

    assert rows[0].logprobs is None


def test_aggregate_reports_rollouts_without_rows_or_reward_and_skipped_calls() -> None:
    empty = trace("ro-2", [])
    empty = type(empty)(rollout_id="ro-2", uid="g", calls=[], reward=0.0, has_reward=False, skipped={"error": 2})

    metrics = aggregate([trace("ro-1", [CALL_1]), empty], "trajectory", WIDE).metrics

    assert metrics["training/n_rows"] == 1
    assert metrics["training/n_rollouts"] == 2
    assert metrics["training/n_rollouts_without_rows"] == 1
    assert metrics["training/n_rollouts_without_reward"] == 1
    assert metrics["training/n_llm_calls_skipped/error"] == 2


def test_an_unknown_level_fails_and_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'turn'.*\['trajectory', 'transition'\]"):
        get_aggregator("turn")


def test_limits_come_from_the_trace_aggregator_or_from_data_by_level() -> None:
    trace_aggregator = {"trajectory_max_prompt_length": 2048, "trajectory_max_response_length": 8192}
    data = {"max_prompt_length": 512, "max_response_length": 256}

    assert limits_for_level("trajectory", trace_aggregator, data) == Limits(2048, 8192)
    assert limits_for_level("transition", trace_aggregator, data) == Limits(512, 256)


# --- property: merging then un-merging gives back every generated token exactly once ---------


@st.composite
def conversations(draw: st.DrawFn) -> list[LLMCall]:
    """Calls of a tool agent: usually extending the context, sometimes re-rendering it."""
    tokens = st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=6)
    calls: list[LLMCall] = []
    context: list[int] = draw(tokens)
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        if calls and draw(st.booleans()):
            context = context + draw(tokens)  # a tool result joins the context
        elif calls:
            context = draw(tokens)  # the prefix breaks: a fresh prompt
        response = draw(tokens)
        calls.append(call(context, response, logprobs=[-float(t) for t in response]))
        context = context + response
    return calls


@settings(max_examples=200, deadline=None)
@given(conversations())
def test_merging_then_unmerging_gives_back_every_generated_token_once(calls: list[LLMCall]) -> None:
    rows, breaks = trajectory_rows(trace("ro-1", calls), Limits(10_000, 10_000))

    # Un-merge: the calls of each row, in order, are its next `n_calls` calls.
    position = 0
    for row in rows:
        merged = calls[position : position + row.n_calls]
        position += row.n_calls
        full = row.prompt_ids + row.response_ids
        assert full == merged[-1].prompt_ids + merged[-1].response_ids
        assert row.prompt_ids == merged[0].prompt_ids
        generated = [t for t, m in zip(row.response_ids, row.response_mask, strict=False) if m == 1]
        assert generated == [t for c in merged for t in c.response_ids]
        for c in merged:  # each call's tokens sit where the call saw and produced them, with mask 1
            start = len(c.prompt_ids) - len(row.prompt_ids)
            assert full[: len(c.prompt_ids)] == c.prompt_ids
            assert row.response_mask[start : start + len(c.response_ids)] == [1] * len(c.response_ids)
            assert row.logprobs[start : start + len(c.response_ids)] == c.logprobs
        assert all(lp == 0.0 for lp, m in zip(row.logprobs, row.response_mask, strict=False) if m == 0)
    assert position == len(calls)
    assert len(breaks) == len(rows) - 1


def _as_read_by_the_trainer(call: LLMCall) -> LLMCall:
    """`call` as the trainer's store client reads it: packed arrays; short ones (< 8 ids) and
    ones beyond int32 still lists."""

    def pack(ids: list[int]):
        try:
            return array("i", ids) if len(ids) >= 8 else list(ids)
        except OverflowError:
            return list(ids)

    return replace(call, prompt_ids=pack(call.prompt_ids), response_ids=pack(call.response_ids))


def _plain(rows):
    """Rows with every token field a list, for comparing an array path's rows with a list path's."""
    return [
        replace(
            r, prompt_ids=list(r.prompt_ids), response_ids=list(r.response_ids), response_mask=list(r.response_mask)
        )
        for r in rows
    ]


def test_token_ids_read_as_int32_arrays_give_the_same_rows_as_lists_and_keep_them_as_arrays() -> None:
    first = call(list(range(10)), [50, 51, 52])
    second = call(list(range(10)) + [50, 51, 52] + [60, 61], list(range(70, 80)))
    broken = call([99] + list(range(1, 20)), [81, 82])
    lists = trace("ro-1", [first, second, broken])
    arrays = trace("ro-1", [_as_read_by_the_trainer(c) for c in lists.calls])
    limits = Limits(64, 64)

    expected, got = aggregate([lists], "trajectory", limits), aggregate([arrays], "trajectory", limits)
    assert _plain(got.rows) == expected.rows and len(got.rows) == 2
    assert [(type(r.prompt_ids), type(r.response_ids), type(r.response_mask)) for r in got.rows] == [
        (array, array, array)
    ] * 2
    assert all(type(r.prompt_ids) is list and type(r.response_ids) is list for r in expected.rows)
    assert _plain(aggregate([arrays], "transition", limits).rows) == aggregate([lists], "transition", limits).rows


def test_a_short_list_beyond_int32_merged_into_an_array_row_keeps_the_row_exact() -> None:
    big = 2**40
    first = call(list(range(10)), [50, 51])
    second = call(list(range(10)) + [50, 51] + [big], [big + 1])
    lists = trace("ro-1", [first, second])
    arrays = trace("ro-1", [_as_read_by_the_trainer(c) for c in lists.calls])

    rows = aggregate([arrays], "trajectory", WIDE).rows
    assert rows == aggregate([lists], "trajectory", WIDE).rows
    assert rows[0].response_ids == [50, 51, big, big + 1] and rows[0].response_mask == [1, 1, 0, 1]


@settings(max_examples=200, deadline=None)
@given(conversations(), st.sampled_from(["trajectory", "transition"]), st.integers(1, 12), st.integers(1, 12))
def test_rows_and_tensors_from_int32_arrays_equal_those_from_lists(
    calls: list[LLMCall], level: str, max_prompt: int, max_response: int
) -> None:
    limits = Limits(max_prompt, max_response)
    lists = aggregate([trace("ro-1", calls)], level, limits)
    arrays = aggregate([trace("ro-1", [_as_read_by_the_trainer(c) for c in calls])], level, limits)

    assert _plain(arrays.rows) == lists.rows
    assert arrays.metrics == lists.metrics
    expected, got = rows_to_tensors(lists.rows, limits, 0), rows_to_tensors(arrays.rows, limits, 0)
    assert expected.keys() == got.keys()
    for key in expected:
        assert expected[key].dtype == got[key].dtype and torch.equal(expected[key], got[key]), key
    attention = got["attention_mask"]
    assert torch.equal(got["position_ids"], torch.clamp(torch.cumsum(attention, dim=-1) - 1, min=0))
