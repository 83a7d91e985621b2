"""agl_proxy.recording.call_record: a finished call becomes a span with the attributes of agl_store.call_span."""

from __future__ import annotations

from agl_proxy.recording.call_record import CallRecord, build_llm_span
from agl_store import call_span


def test_the_span_of_a_call_carries_every_attribute_of_the_call_span_schema() -> None:
    record = CallRecord(
        operation="chat", rollout_id="ro-1", attempt_id="at-1", requested_model="tiny", stream=False, start_time=1.0
    )
    # An answered call of a rollout whose mode's sampling applied, one response id short of its usage:
    # every attribute is set (the mode and the token-id cause are left out when there is none).
    record.request = {"messages": [], "temperature": 1.0, "max_completion_tokens": 8}
    record.response = {
        "model": "tiny",
        "prompt_token_ids": [1, 2],
        "choices": [{"index": 0, "token_ids": [3]}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2},
    }
    record.status_code = 200
    record.sampling_mode = "train"
    record.tools_left_out = ["web_search"]  # a translated call's hosted tools
    record.latency_s = 0.5

    span = build_llm_span(record)

    # `agl.delta` is the store's, only in compact reads; a call never carries it.
    schema = {value for name, value in vars(call_span).items() if name.isupper() and name not in ("NAME", "DELTA")}
    assert span.name == call_span.NAME and set(span.attributes) == schema
    assert span.attributes[call_span.PROMPT_TOKEN_IDS] == [1, 2]
    assert span.attributes[call_span.CHOICES] == [
        {"index": 0, "token_ids": [3], "logprobs": None, "finish_reason": None}
    ]
    assert span.attributes[call_span.OUTPUT_TOKENS] == 2 and span.end_time == 1.5
    assert span.attributes[call_span.SAMPLING] == {"temperature": 1.0, "max_tokens": 8}
    assert span.attributes[call_span.TOKEN_IDS_STATUS] == "mismatch"
    assert span.attributes[call_span.TOKEN_IDS_CAUSE] == "1 response token ids but usage.completion_tokens is 2"


def test_each_choice_carries_the_segments_of_weights_that_sampled_it() -> None:
    record = CallRecord(
        operation="chat", rollout_id="ro-1", attempt_id="at-1", requested_model="tiny", stream=False, start_time=1.0
    )
    record.response = {
        "prompt_token_ids": [1, 2],
        "choices": [{"index": 0, "token_ids": [3, 4, 5]}, {"index": 1, "token_ids": [6]}],
    }
    record.status_code = 200
    # The token chain's: choice 0 went on across an update (version 3, then 4), choice 1 did not.
    record.segments = {0: [("3", 1), ("4", 2)], 1: [("4", 1)]}

    choices = build_llm_span(record).attributes[call_span.CHOICES]

    assert [choice["segments"] for choice in choices] == [[["3", 1], ["4", 2]], [["4", 1]]]


def test_a_call_the_token_chain_did_not_serve_has_no_segments() -> None:
    record = CallRecord(
        operation="chat", rollout_id="ro-1", attempt_id="at-1", requested_model="tiny", stream=False, start_time=1.0
    )
    record.response = {"prompt_token_ids": [1, 2], "choices": [{"index": 0, "token_ids": [3]}]}
    record.status_code = 200

    (choice,) = build_llm_span(record).attributes[call_span.CHOICES]

    assert "segments" not in choice
