"""Trajectory rows from the call graph the proxy records (`agl.chain`): one row per root-to-leaf path."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_store.sqlite import SQLiteStore
from agl_train.core.aggregate import Limits, aggregate, trajectory_rows
from agl_train.core.call_graph import call_graph, check_superseded
from agl_train.core.traces import read_rollout, trace_from_spans

from .builders import llm_call_span, reward

WIDE = Limits(max_prompt_length=100, max_response_length=100)
FIRST = {"prompt": "rendered", "cause": "first_call"}

# A tool agent whose calls the proxy bridged: A, then B continuing A's answer (tool result [20, 21]
# inserted), then C continuing B's (turn glue [22]).
SYSTEM_USER = [1, 2, 3]
A = llm_call_span(SYSTEM_USER, [10, 11], sequence_id=1, span_id="A", chain=FIRST)
B_PROMPT = SYSTEM_USER + [10, 11, 20, 21]
B = llm_call_span(B_PROMPT, [12], sequence_id=2, span_id="B", chain={"prompt": "bridged", "parent": "A", "choice": 0})
C = llm_call_span(
    B_PROMPT + [12, 22], [13, 14], sequence_id=3, span_id="C", chain={"prompt": "bridged", "parent": "B", "choice": 0}
)


def rows_of(*spans, superseded: str = "drop"):
    trace = trace_from_spans("ro-1", [*spans, reward(1.0)])
    return trajectory_rows(trace, WIDE, superseded=superseded)


def trained_tokens(rows) -> list[int]:
    """Every token a row trains (mask 1), over all rows."""
    return [t for row in rows for t, m in zip(row.response_ids, row.response_mask, strict=True) if m]


def test_a_linear_bridged_chain_is_one_row() -> None:
    rows, breaks = rows_of(A, B, C)

    (row,) = rows
    assert row.prompt_ids == SYSTEM_USER
    assert row.response_ids == [10, 11, 20, 21, 12, 22, 13, 14]
    assert row.response_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert row.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, 0.0, -0.5, -0.5]
    assert (row.turn_index, row.n_calls, breaks) == (0, 3, [])


def test_a_fork_is_two_rows_and_the_shared_tokens_are_trained_once() -> None:
    # Two sub-conversations continue A's answer: B, and D with another tool result.
    d = llm_call_span(
        SYSTEM_USER + [10, 11, 30], [15], sequence_id=3, span_id="D", chain={"prompt": "bridged", "parent": "A"}
    )
    rows, breaks = rows_of(A, B, d)

    first, second = rows
    assert (first.response_ids, first.response_mask) == ([10, 11, 20, 21, 12], [1, 1, 0, 0, 1])
    assert (second.response_ids, second.response_mask) == ([10, 11, 30, 15], [0, 0, 0, 1])
    assert sorted(trained_tokens(rows)) == [10, 11, 12, 15]  # each sampled token once
    assert breaks == []


def test_the_choices_of_an_n_call_fork_and_a_bridged_call_continues_the_choice_it_names() -> None:
    a = llm_call_span(SYSTEM_USER, [10], [11], sequence_id=1, span_id="A", chain=FIRST)
    b = llm_call_span(
        SYSTEM_USER + [10, 20],
        [12],
        sequence_id=2,
        span_id="B",
        chain={"prompt": "bridged", "parent": "A", "choice": 0},
    )
    rows, breaks = rows_of(a, b)

    assert [(row.response_ids, row.response_mask) for row in rows] == [([10, 20, 12], [1, 0, 1]), ([11], [1])]
    assert breaks == []


@pytest.mark.parametrize("superseded", ["drop", "mask"])
def test_a_retry_supersedes_the_branch_it_replaces(superseded: str) -> None:
    # B's answer was thrown away: the agent sent the same request again (B2), then went on from B2's answer.
    b2 = llm_call_span(B_PROMPT, [16], sequence_id=3, span_id="B2", chain={"prompt": "retry", "parent": "B"})
    c = llm_call_span(
        B_PROMPT + [16, 22], [13], sequence_id=4, span_id="C", chain={"prompt": "bridged", "parent": "B2", "choice": 0}
    )
    rows, breaks = rows_of(A, B, b2, c, superseded=superseded)

    kept = rows[0]
    assert (kept.response_ids, kept.response_mask) == ([10, 11, 20, 21, 16, 22, 13], [1, 1, 0, 0, 1, 0, 1])
    if superseded == "drop":
        assert len(rows) == 1
    else:
        _, masked = rows  # last: a rollout's first row trains tokens
        assert (masked.response_ids, masked.response_mask) == ([10, 11, 20, 21, 12], [0, 0, 0, 0, 0])
    assert sorted(trained_tokens(rows)) == [10, 11, 13, 16]  # B's answer is trained in neither mode
    assert breaks == []


def _repeat_of(span_id: str, twin: str, response: int, sequence_id: int):
    return llm_call_span(B_PROMPT, [response], sequence_id=sequence_id, span_id=span_id,
                         chain={"prompt": "retry", "parent": twin})  # fmt: skip


def _continuing(twin: str, response: int, sequence_id: int):
    return llm_call_span(B_PROMPT + [response, 22], [13], sequence_id=sequence_id, span_id=f"C-{twin}",
                         chain={"prompt": "bridged", "parent": twin, "choice": 0})  # fmt: skip


@pytest.mark.parametrize("superseded", ["drop", "mask"])
def test_a_repeat_of_a_call_the_agent_went_on_from_is_a_sample_beside_it(superseded: str) -> None:
    # Best of two: the agent sampled B's request twice (B2 repeats it) and went on from B's answer.
    rows, breaks = rows_of(A, B, _repeat_of("B2", "B", 16, 3), _continuing("B", 12, 4), superseded=superseded)

    followed, sample = rows
    assert (followed.response_ids, followed.response_mask) == ([10, 11, 20, 21, 12, 22, 13], [1, 1, 0, 0, 1, 0, 1])
    assert (sample.response_ids, sample.response_mask) == ([10, 11, 20, 21, 16], [0, 0, 0, 0, 1])
    assert sorted(trained_tokens(rows)) == [10, 11, 12, 13, 16]
    assert breaks == []


def test_repeats_before_the_followed_one_are_retries_and_those_after_it_samples() -> None:
    # B and B2 were thrown away (retries), the agent went on from B3, and sampled B4 beside it.
    spans = (A, B, _repeat_of("B2", "B", 16, 3), _repeat_of("B3", "B2", 17, 4), _repeat_of("B4", "B", 18, 5))
    rows, _ = rows_of(*spans, _continuing("B3", 17, 6))

    assert [row.response_ids[4:] for row in rows] == [[17, 22, 13], [18]]
    assert sorted(trained_tokens(rows)) == [10, 11, 13, 17, 18]


def test_a_repeat_of_a_call_a_later_call_branched_from_is_a_sample_too() -> None:
    # The agent went on from B, but its follow-up C was rendered whole (B's row was full).
    c = llm_call_span(B_PROMPT + [12, 22], [13], sequence_id=4, span_id="C",
                      chain={"prompt": "branched", "parent": "B", "cause": "row_full"})  # fmt: skip
    rows, _ = rows_of(A, B, _repeat_of("B2", "B", 16, 3), c)

    assert sorted(trained_tokens(rows)) == [10, 11, 12, 13, 16]


def test_a_branched_call_is_a_new_root_with_a_prefix_break_record() -> None:
    # The agent edited its history: the proxy rendered C whole, branched from A.
    edited = [1, 9, 3, 10, 11, 20, 21, 12, 22]
    c = llm_call_span(
        edited, [13], sequence_id=3, span_id="C", chain={"prompt": "branched", "parent": "A", "cause": "history_edited"}
    )
    trace = trace_from_spans("ro-1", [A, B, c, reward(1.0)])
    aggregation = aggregate([trace], "trajectory", WIDE)

    first, second = aggregation.rows
    assert (first.n_calls, second.prompt_ids, second.response_mask) == (2, edited, [1])
    (record,) = aggregation.breaks
    assert (record.turn_index, record.diverge_at, record.kind) == (2, 1, "template")
    assert aggregation.metrics["training/n_llm_calls/branched/history_edited"] == 1
    assert aggregation.metrics["training/rows_per_rollout/max"] == 2


def test_the_call_after_a_full_row_starts_a_row_with_its_bridged_prompt_and_no_break_record() -> None:
    # B's row had no room left under the proxy's row budget: C's bridged prompt starts a row of its own.
    c = llm_call_span(
        B_PROMPT + [12, 22],
        [13, 14],
        sequence_id=3,
        span_id="C",
        chain={"prompt": "branched", "parent": "B", "cause": "row_full"},
    )
    trace = trace_from_spans("ro-1", [A, B, c, reward(1.0)])
    aggregation = aggregate([trace], "trajectory", WIDE)

    first, second = aggregation.rows
    assert (first.n_calls, first.response_ids) == (2, [10, 11, 20, 21, 12])
    assert (second.prompt_ids, second.response_ids, second.response_mask) == (B_PROMPT + [12, 22], [13, 14], [1, 1])
    assert aggregation.breaks == []
    assert aggregation.metrics["training/n_llm_calls/branched/row_full"] == 1


def test_calls_without_a_chain_and_calls_a_backend_rendered_merge_by_prefix_as_before() -> None:
    rendered = {"prompt": "rendered", "cause": "backend_renders"}
    plain = [
        llm_call_span(SYSTEM_USER, [10, 11], sequence_id=1),
        llm_call_span(B_PROMPT, [12], sequence_id=2, chain=rendered),
        llm_call_span([1, 9], [13], sequence_id=3),  # does not extend: a new row
    ]
    aggregation = aggregate([trace_from_spans("ro-1", [*plain, reward(1.0)])], "trajectory", WIDE)

    assert [row.n_calls for row in aggregation.rows] == [2, 1]
    assert [record.turn_index for record in aggregation.breaks] == [2]
    metrics = aggregation.metrics
    assert (metrics["training/n_llm_calls/unchained"], metrics["training/n_llm_calls/rendered/backend_renders"]) == (
        2,
        1,
    )


def test_a_bridged_call_whose_prompt_does_not_extend_its_parent_falls_back_to_the_prefix_rule() -> None:
    wrong = llm_call_span([1, 2, 4], [12], sequence_id=2, span_id="B", chain={"prompt": "bridged", "parent": "A"})
    rows, breaks = rows_of(A, wrong)

    assert len(rows) == 2 and [record.turn_index for record in breaks] == [1]


def test_step_metrics_count_calls_by_how_their_prompt_was_made_and_rows_per_rollout() -> None:
    one = trace_from_spans("ro-1", [A, B, C, reward(1.0)])
    other = trace_from_spans("ro-2", [llm_call_span([5], [6], rollout_id="ro-2"), reward(0.0, rollout_id="ro-2")])
    metrics = aggregate([one, other], "trajectory", WIDE).metrics

    assert {k: v for k, v in metrics.items() if k.startswith("training/n_llm_calls/")} == {
        "training/n_llm_calls/bridged": 2,
        "training/n_llm_calls/retry": 0,
        "training/n_llm_calls/branched": 0,
        "training/n_llm_calls/rendered": 1,
        "training/n_llm_calls/unchained": 1,
        "training/n_llm_calls/rendered/first_call": 1,
    }
    assert (metrics["training/rows_per_rollout/mean"], metrics["training/rows_per_rollout/max"]) == (1.0, 1)


def test_an_unknown_superseded_mode_names_the_setting() -> None:
    with pytest.raises(ValueError, match="trace_aggregator.superseded must be one of"):
        check_superseded("keep")
    with pytest.raises(ValueError, match="superseded"):
        call_graph(trace_from_spans("ro-1", [A]), superseded="keep")


async def test_the_chain_is_read_back_from_a_store(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "agl.db") as store:
        rollout = await store.start_rollout(input={"q": 1})
        rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
        for span in (A, B, C):
            await store.add_span(span.model_copy(update={"rollout_id": rid, "attempt_id": aid, "sequence_id": None}))
        trace = await read_rollout(store, rid)

    assert [call.chain.prompt if call.chain else None for call in trace.calls] == ["rendered", "bridged", "bridged"]
    rows, _ = trajectory_rows(trace, WIDE)
    assert [row.n_calls for row in rows] == [3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=-1, max_value=30), min_size=1, max_size=12))
def test_every_sampled_token_of_any_call_tree_is_trained_exactly_once(parents: list[int]) -> None:
    # Call i continues call parents[i] (taken modulo i; -1 or the first call: a new root, branched).
    spans, contexts, children = [], [], set()
    for i, choice in enumerate(parents):
        response = [10 * i + 1, 10 * i + 2]
        if i == 0 or choice < 0:
            prompt, chain = [1000 + i], (FIRST if i == 0 else {"prompt": "branched", "cause": "history_edited"})
        else:
            parent = choice % i
            children.add(parent)
            prompt = contexts[parent] + [5000 + i]
            chain = {"prompt": "bridged", "parent": f"s{parent}", "choice": 0}
        spans.append(llm_call_span(prompt, response, sequence_id=i + 1, span_id=f"s{i}", chain=chain))
        contexts.append(prompt + response)
    rows, _ = rows_of(*spans)

    assert sorted(trained_tokens(rows)) == sorted(t for i in range(len(parents)) for t in (10 * i + 1, 10 * i + 2))
    leaves = [contexts[i] for i in range(len(parents)) if i not in children]
    assert sorted(list(row.prompt_ids) + list(row.response_ids) for row in rows) == sorted(leaves)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=30)), min_size=1, max_size=12))
def test_with_repeats_every_followed_call_is_trained_once_and_a_rollout_s_first_row_trains(
    calls: list[tuple[bool, int]],
) -> None:
    # Call i repeats call parents[i] (same prompt) or continues it (bridged), taken modulo i.
    spans, prompts, followed = [], [], set()
    for i, (repeat, choice) in enumerate(calls):
        response = [10 * i + 1]
        if i == 0:
            prompt, chain = [1000], FIRST
        elif repeat:
            prompt, chain = prompts[choice % i], {"prompt": "retry", "parent": f"s{choice % i}"}
        else:
            followed.add(choice % i)
            prompt = prompts[choice % i] + [10 * (choice % i) + 1, 5000 + i]
            chain = {"prompt": "bridged", "parent": f"s{choice % i}", "choice": 0}
        spans.append(llm_call_span(prompt, response, sequence_id=i + 1, span_id=f"s{i}", chain=chain))
        prompts.append(prompt)

    trained = trained_tokens(rows_of(*spans)[0])
    assert len(trained) == len(set(trained))
    assert {10 * i + 1 for i in followed} <= set(trained)
    masked, _ = rows_of(*spans, superseded="mask")
    assert any(masked[0].response_mask)
