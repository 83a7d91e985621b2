"""What a bridge proves before it bridges: that the template rendered the head the same with more
after it, and which reasoning a template may drop (the small requests that tell)."""

from __future__ import annotations

from agl_proxy.chain.bridging import keeps_head, reasoning_requests

SYSTEM = {"role": "system", "content": "Be brief."}
DUMMY = {"role": "user", "content": "."}
QUESTION = {"role": "user", "content": "Weather in Paris?"}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
THOUGHT_CALL = {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning": "Paris."}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
ANSWER = {"role": "assistant", "content": "Sunny.", "reasoning_content": "It is sunny."}
AGAIN = {"role": "user", "content": "And tomorrow?"}


def test_a_rendering_keeps_the_head_when_it_starts_with_it_and_goes_on() -> None:
    head = [1, 2, 3]
    assert keeps_head([1, 2, 3, 4], head)
    assert not keeps_head([1, 2, 3], head)  # nothing after it
    # Mistral v0.3: the tools and the system prompt move to the new last user message.
    assert not keeps_head([1, 9, 3, 4], head)


def test_the_reasoning_requests_differ_by_the_reasoning_since_the_last_user_message() -> None:
    body = {"messages": [SYSTEM, QUESTION, THOUGHT_CALL, RESULT, ANSWER, AGAIN], "tools": [], "max_tokens": 8}
    requests = reasoning_requests(body, new_from=5)
    assert requests is not None
    kept, dropped = requests
    assert kept["messages"] == [SYSTEM, DUMMY, THOUGHT_CALL, RESULT, ANSWER, AGAIN]
    assert dropped["messages"] == [
        SYSTEM,
        DUMMY,
        {k: v for k, v in THOUGHT_CALL.items() if k != "reasoning"},
        RESULT,
        {k: v for k, v in ANSWER.items() if k != "reasoning_content"},
        AGAIN,
    ]
    # Compared as renderings of the history, not as prompts.
    assert kept["add_generation_prompt"] is False and dropped["tools"] == [] and dropped["max_tokens"] == 8


def test_no_reasoning_requests_without_reasoning_since_the_last_user_message() -> None:
    plain = {"role": "assistant", "content": "Sunny."}
    assert reasoning_requests({"messages": [SYSTEM, QUESTION, plain, AGAIN]}, new_from=3) is None
    # Reasoning before the last user message is the template's business at an earlier call.
    body = {"messages": [SYSTEM, QUESTION, ANSWER, AGAIN, plain, AGAIN]}
    assert reasoning_requests(body, new_from=5) is None
