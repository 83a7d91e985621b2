"""The token view: rows as the trainer builds them, one role per token."""

from __future__ import annotations

from agl_store.models import reward_span
from agl_train.core.aggregate import Limits
from agl_train.core.traces import trace_from_spans
from agl_train.view.token_view import TokenViewOptions, token_view, token_view_of_trace

from .rollouts import OBSERVATION, known_calls, known_limits, llm_call_span, write_known_rollout

WIDE = Limits(max_prompt_length=4096, max_response_length=4096)


def trace_of(calls, reward=1.0):
    spans = [llm_call_span("ro-1", "at-1", c["prompt"], c["response"], float(k)) for k, c in enumerate(calls)]
    spans += [reward_span("ro-1", "at-1", reward)] if reward is not None else []
    for sequence_id, span in enumerate(spans, start=1):
        span.sequence_id = sequence_id
    return trace_from_spans("ro-1", spans)


def test_merged_calls_show_prompt_generated_and_inserted_tokens() -> None:
    calls = [{"prompt": [1, 2, 3], "response": [4, 5]}, {"prompt": [1, 2, 3, 4, 5, 6, 7], "response": [8]}]

    view = token_view_of_trace(trace_of(calls), TokenViewOptions(limits=WIDE))

    (row,) = view["rows"]
    assert row["ids"] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert row["roles"] == "pppggiig"
    assert (row["n_calls"], row["sequence_ids"], row["trained_tokens"], row["break"]) == (2, [1, 2], 3, None)
    assert (view["reward"], view["has_reward"], view["decoded"], view["pieces"]) == (1.0, True, False, {})


def test_transition_level_gives_one_row_per_call() -> None:
    calls = [{"prompt": [1, 2, 3], "response": [4, 5]}, {"prompt": [1, 2, 3, 4, 5, 6, 7], "response": [8]}]

    view = token_view_of_trace(trace_of(calls), TokenViewOptions(level="transition", limits=WIDE))

    assert [row["roles"] for row in view["rows"]] == ["pppgg", "pppppppg"]


def test_a_broken_prefix_starts_a_new_row_and_says_why() -> None:
    calls = [{"prompt": [1, 2, 3], "response": [4, 5]}, {"prompt": [1, 9, 3, 4, 5, 6], "response": [7]}]

    view = token_view_of_trace(trace_of(calls, reward=None), TokenViewOptions(limits=WIDE))

    first, second = view["rows"]
    assert (first["break"], second["break"]["turn_index"], second["break"]["diverge_at"]) == (None, 1, 1)
    assert second["break"]["kind"] == "template"  # diverged inside the previous prompt
    assert "re-rendered" in second["break"]["explanation"]
    assert (view["has_reward"], view["reward"], view["metrics"]["training/n_prefix_breaks"]) == (False, 0.0, 1)


def test_limits_truncate_a_response_and_drop_a_long_prompt() -> None:
    calls = [{"prompt": [1, 2], "response": [3, 4, 5, 6]}, {"prompt": [9, 9, 9, 9], "response": [7]}]

    view = token_view_of_trace(trace_of(calls), TokenViewOptions(limits=Limits(3, 2)))

    first, second = view["rows"]
    assert (first["ids"], first["roles"], first["truncated"], first["response_length"]) == (
        [1, 2, 3, 4, 5, 6],
        "ppggtt",
        True,
        2,
    )
    assert (second["roles"], second["is_drop"], second["trained_tokens"]) == ("ddddd", True, 0)


def test_the_known_rollout_decoded_with_the_tokenizer(tokenizer, encode) -> None:
    calls = known_calls(encode)
    limits = known_limits(calls)

    view = token_view_of_trace(trace_of(calls), TokenViewOptions(limits=limits), tokenizer)

    first, second = view["rows"]
    observation = len(encode(OBSERVATION))
    assert first["roles"] == (
        "p" * len(calls[0]["prompt"])
        + "g" * len(calls[0]["response"])
        + "i" * observation
        + "g" * (len(calls[1]["response"]) - 4)
        + "t" * 4
    )
    assert set(second["roles"]) == {"d"} and second["break"]["turn_index"] == 2
    assert "".join(view["pieces"][str(i)] for i in calls[0]["response"]) == "Let me call get_weather(Paris).<|im_end|>"


async def test_token_view_reads_the_latest_attempt_from_the_store(store, encode) -> None:
    known = await write_known_rollout(store, encode)

    view = await token_view(store, known.rollout_id, TokenViewOptions(limits=WIDE))

    assert (view["attempt_id"], view["reward"], view["n_calls"], len(view["rows"])) == (known.attempt_id, 0.75, 3, 2)


def test_a_row_shows_which_weights_sampled_its_response() -> None:
    # An answer that went on across a weight update (5 tokens of version 3, 7 of version 4),
    # then a follow-up on version 4 after one inserted token.
    answer = list(range(10, 22))
    first = llm_call_span("ro-1", "at-1", [1, 2], answer, 0.0, version="3")
    first.attributes["agl.choices"][0]["segments"] = [["3", 5], ["4", 7]]
    follow_up = llm_call_span("ro-1", "at-1", [1, 2, *answer, 30], [31, 32], 1.0, version="4")
    for sequence_id, span in enumerate([first, follow_up], start=1):
        span.sequence_id = sequence_id

    view = token_view_of_trace(trace_from_spans("ro-1", [first, follow_up]), TokenViewOptions(limits=Limits(8, 14)))

    (row,) = view["rows"]
    assert row["roles"] == "pp" + "g" * 12 + "i" + "g" + "t"
    assert row["versions"] == [[3, 5], [4, 7], [None, 1], [4, 2]]  # the truncated token's too
