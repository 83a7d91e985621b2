"""Where an answer's text ends at a stop string, as vLLM's detokenizer cuts it (`check_stop_strings`)."""

from __future__ import annotations

from agl_proxy.chain.stops import cut_at_stop_string, stop_string_cut, stop_token_reason


def test_the_stop_string_that_completes_first_ends_the_text() -> None:
    text = "Action Input: 3\nObservation"
    # "\nObs" completes before "Observation" does, though listed after it.
    assert stop_string_cut(text, ["Observation", "\nObs"], include=False) == ("\nObs", 15)
    assert stop_string_cut(text, ["Observation", "\nObs"], include=True) == ("\nObs", 19)
    # Both complete at the same place: the request's order decides.
    assert stop_string_cut(text, ["ation", "Observation"], include=False) == ("ation", 22)
    assert stop_string_cut(text, ["Thought:"], include=False) is None


def test_the_message_s_last_text_is_cut() -> None:
    sampling = {"stop": ["\nObservation"]}
    message = {"role": "assistant", "content": "Action: search\nAction Input: cats\nObservation"}
    assert cut_at_stop_string(message, sampling) == "\nObservation"
    assert message["content"] == "Action: search\nAction Input: cats"

    thinking = {"role": "assistant", "content": None, "reasoning": "let me see\nObservation"}
    assert cut_at_stop_string(thinking, sampling) == "\nObservation"
    assert thinking["reasoning"] == "let me see"

    ended = {"role": "assistant", "content": "Final Answer: 4<|im_end|>"}
    assert cut_at_stop_string(ended, sampling) is None
    assert ended["content"] == "Final Answer: 4<|im_end|>"


def test_a_listed_stop_token_is_the_stop_reason() -> None:
    assert stop_token_reason([5, 9, 42], {"stop_token_ids": [42]}) == 42
    assert stop_token_reason([5, 9, 151645], {"stop_token_ids": [42]}) is None  # the end-of-sequence id
