"""Reading a rollout's spans: trainable calls, skipped calls, the final reward."""

from __future__ import annotations

import pytest

from agl_store.models import Span
from agl_train.core.traces import (
    SKIP_ERROR,
    SKIP_NO_PROMPT_IDS,
    SKIP_NO_RESPONSE_IDS,
    SKIP_TOKEN_IDS_MISMATCH,
    calls_from_spans,
    final_reward,
    read_rollout,
    trace_from_spans,
)

from .builders import llm_call_span, reward


def test_calls_come_back_in_sequence_order_with_their_token_ids_and_logprobs() -> None:
    spans = [llm_call_span([1, 2, 3, 4], [5], sequence_id=2), llm_call_span([1, 2], [3], sequence_id=1)]

    calls, skipped = calls_from_spans(spans)

    assert [(c.prompt_ids, c.response_ids, c.sequence_id) for c in calls] == [([1, 2], [3], 1), ([1, 2, 3, 4], [5], 2)]
    assert calls[0].logprobs == [-0.5]
    assert skipped == {}


def test_failed_calls_and_calls_without_token_ids_are_skipped_and_counted() -> None:
    no_prompt = llm_call_span([1], [2], sequence_id=3)
    no_prompt.attributes["agl.prompt_token_ids"] = None
    no_choices = llm_call_span([1], sequence_id=4)
    spans = [
        llm_call_span([1, 2], [3], sequence_id=1),
        llm_call_span([1, 2], [3], sequence_id=2, error=True),
        no_prompt,
        no_choices,
        llm_call_span([1, 2], [], sequence_id=5),
    ]

    calls, skipped = calls_from_spans(spans)

    assert len(calls) == 1
    assert skipped == {SKIP_ERROR: 1, SKIP_NO_PROMPT_IDS: 1, SKIP_NO_RESPONSE_IDS: 2}


def test_calls_whose_ids_disagree_with_the_backends_usage_are_skipped_and_counted() -> None:
    mismatch = llm_call_span([1, 2], [3], sequence_id=2)
    mismatch.attributes["agl.token_ids.status"] = "mismatch"
    ok = llm_call_span([1, 2], [3], sequence_id=1)
    ok.attributes["agl.token_ids.status"] = "ok"

    calls, skipped = calls_from_spans([ok, mismatch])

    assert [call.sequence_id for call in calls] == [1]
    assert skipped == {SKIP_TOKEN_IDS_MISMATCH: 1}


def test_each_choice_of_an_n_call_is_a_call_and_misaligned_logprobs_are_dropped() -> None:
    span = llm_call_span([1, 2], [3, 4], [5], sequence_id=1)
    span.attributes["agl.choices"][1]["logprobs"] = [-1.0, -2.0]  # two logprobs for one token

    calls, _ = calls_from_spans([span])

    assert [(c.choice_index, c.response_ids, c.logprobs) for c in calls] == [(0, [3, 4], [-0.5, -0.5]), (1, [5], None)]


def test_the_last_reward_in_sequence_order_is_the_final_reward() -> None:
    assert final_reward([reward(0.25, sequence_id=3), reward(1.0, sequence_id=1)]) == 0.25
    assert final_reward([llm_call_span([1], [2], sequence_id=1)]) is None


def test_agent_lightning_03_reward_spans_count_and_non_finite_values_do_not() -> None:
    emitted = Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        sequence_id=2,
        name="agentlightning.annotation",
        attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 0.75},
    )

    assert final_reward([reward(1.0, sequence_id=1), emitted]) == 0.75
    assert final_reward([reward(1.0, sequence_id=1), reward(float("nan"), sequence_id=2)]) == 1.0


def test_a_rollout_without_reward_gets_the_fill_value() -> None:
    trace = trace_from_spans("ro-1", [llm_call_span([1], [2], sequence_id=1)], uid="q7", reward_fillna_value=-1.0)

    assert (trace.reward, trace.has_reward, trace.uid) == (-1.0, False, "q7")
    assert trace_from_spans("ro-1", []).uid == "ro-1"


def test_other_span_names_are_ignored() -> None:
    other = Span(rollout_id="ro-1", attempt_id="at-1", sequence_id=1, name="tool.search", attributes={"q": "x"})

    assert calls_from_spans([other]) == ([], {})


async def test_read_rollout_reads_the_latest_attempt_of_a_real_store() -> None:
    sqlite = pytest.importorskip("agl_store.sqlite")
    store = sqlite.SQLiteStore(":memory:")
    await store.open()
    try:
        rollout = await store.start_rollout(input={"question": "2+2"})
        first = rollout.attempt.attempt_id
        await store.add_span(llm_call_span([9, 9], [9], rollout_id=rollout.rollout_id, attempt_id=first))
        retry = await store.start_attempt(rollout.rollout_id)
        latest = retry.attempt.attempt_id
        for span in (
            llm_call_span([1, 2], [3], rollout_id=rollout.rollout_id, attempt_id=latest),
            llm_call_span([1, 2, 3, 4], [5, 6], rollout_id=rollout.rollout_id, attempt_id=latest),
            reward(0.5, rollout_id=rollout.rollout_id, attempt_id=latest),
        ):
            await store.add_span(span)

        trace = await read_rollout(store, rollout.rollout_id, uid="q1")

        assert trace.attempt_id == latest
        assert [(c.prompt_ids, c.response_ids) for c in trace.calls] == [([1, 2], [3]), ([1, 2, 3, 4], [5, 6])]
        assert [c.sequence_id for c in trace.calls] == sorted(c.sequence_id for c in trace.calls)
        assert (trace.reward, trace.has_reward) == (0.5, True)
    finally:
        await store.close()
