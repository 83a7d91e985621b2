"""The token chain's pure logic: how messages compare, which earlier call a request continues, why
it branches, where the new messages start, and how much the chain remembers."""

from __future__ import annotations

from typing import Any

import pytest

from agl_proxy.chain.bridging import bridge_requests, echoed_answer_end, new_messages_start, turn_glue
from agl_proxy.chain.digests import Answer, message_keys, request_keys
from agl_proxy.chain.engine import common_suffix
from agl_proxy.chain.heads import ChainHeads, head_key
from agl_proxy.chain.links import decide
from agl_proxy.chain.memory import ChainMemory, chain_entry

SYSTEM = {"role": "system", "content": "Be brief."}
QUESTION = {"role": "user", "content": "Weather in Paris?"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
ANSWER = {"role": "assistant", "content": None, "tool_calls": [CALL]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _entry(span_id: str, messages: list[dict[str, Any]], *answers: dict[str, Any], prompt: int = 10, **extra: Any):
    body = {"messages": messages, "tools": TOOLS, **extra}
    return chain_entry(
        span_id, request_keys(body), list(range(prompt)), [([100 + i, 2], a) for i, a in enumerate(answers)]
    )


def _link(entries, messages: list[dict[str, Any]], **extra: Any):
    return decide(entries, request_keys({"messages": messages, "tools": TOOLS, **extra}))


def test_an_echoed_answer_matches_with_its_ids_key_order_and_empty_content_aside() -> None:
    echoed = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "other", "type": "function", "function": {"arguments": '{ "city":"Paris" }', "name": "get_weather"}}
        ],
    }
    assert Answer.of(ANSWER).matches(message_keys(echoed))
    other_city = {**echoed, "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]}
    assert not Answer.of(ANSWER).matches(message_keys(other_city))


def test_content_as_text_parts_equals_the_string() -> None:
    parts = {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Paris?"}]}
    assert message_keys(parts) == message_keys(QUESTION)


def test_reasoning_counts_only_where_the_client_sent_it_back() -> None:
    answer = Answer.of({"role": "assistant", "content": "Sunny.", "reasoning": "Paris is in France."})
    assert answer.matches(message_keys({"role": "assistant", "content": "Sunny."}))
    assert answer.matches(
        message_keys({"role": "assistant", "content": "Sunny.", "reasoning_content": "Paris is in France."})
    )
    assert not answer.matches(message_keys({"role": "assistant", "content": "Sunny.", "reasoning": "Guessing."}))


def test_a_follow_up_is_bridged_to_the_call_with_the_longest_history() -> None:
    first = _entry("s1", [SYSTEM, QUESTION], ANSWER)
    second = _entry("s2", [SYSTEM, QUESTION, ANSWER, RESULT], {"role": "assistant", "content": "Sunny."})
    history = [SYSTEM, QUESTION, ANSWER, RESULT, {"role": "assistant", "content": "Sunny."}, QUESTION]
    # Oldest first, or as read back from the store in another order: the longest history wins.
    for entries in ([first, second], [second, first]):
        link = _link(entries, history)
        assert (link.kind, link.parent.span_id, link.choice, link.new_from) == ("bridged", "s2", 0, 5)


def test_the_follow_up_continues_the_choice_the_agent_kept() -> None:
    first = _entry("s1", [QUESTION], {"role": "assistant", "content": "A"}, {"role": "assistant", "content": "B"})
    link = _link([first], [QUESTION, {"role": "assistant", "content": "B"}, QUESTION])
    assert (link.kind, link.choice) == ("bridged", 1)


@pytest.mark.parametrize(
    ("messages", "extra", "kind", "cause", "parent"),
    [
        ([SYSTEM, QUESTION], {}, "retry", None, "s2"),
        (
            [SYSTEM, {"role": "user", "content": "Weather in Rome?"}, ANSWER, RESULT],
            {},
            "branched",
            "history_edited",
            "s2",
        ),
        ([{"role": "system", "content": "Be verbose."}, QUESTION], {}, "branched", "system_changed", None),
        (
            [SYSTEM, QUESTION, {"role": "assistant", "content": "Rain."}, QUESTION],
            {},
            "branched",
            "answer_changed",
            "s2",
        ),
        ([SYSTEM, QUESTION, ANSWER, RESULT], {"tools": []}, "branched", "tools_changed", "s2"),
        ([SYSTEM, QUESTION, ANSWER, RESULT], {"chat_template_kwargs": {"x": 1}}, "branched", "template_changed", "s2"),
    ],
)
def test_why_a_call_is_not_bridged(messages, extra, kind, cause, parent) -> None:
    entries = [_entry("s2", [SYSTEM, QUESTION], ANSWER)]
    link = _link(entries, messages, **extra)
    assert (link.kind, link.cause, link.parent.span_id if link.parent else None) == (kind, cause, parent)


def test_shortened_history_and_dropped_reasoning_name_their_cause() -> None:
    thought = {"role": "assistant", "content": "Sunny.", "reasoning": "Look it up."}
    entries = [_entry("s3", [SYSTEM, QUESTION, thought, QUESTION], {"role": "assistant", "content": "Still sunny."})]
    assert _link(entries, [SYSTEM]).cause == "history_shortened"
    dropped = _link(entries, [SYSTEM, QUESTION, {"role": "assistant", "content": "Sunny."}, QUESTION, QUESTION])
    assert (dropped.kind, dropped.cause, dropped.parent.span_id) == ("branched", "reasoning_dropped", "s3")
    assert decide([], request_keys({"messages": [QUESTION]})).cause == "first_call"


def test_the_bridge_renders_only_the_new_messages_after_the_echoed_answer() -> None:
    body = {"messages": [SYSTEM, QUESTION, ANSWER, RESULT, QUESTION], "tools": TOOLS, "temperature": 1.0}
    full, base = bridge_requests(body, new_from=3)
    assert full["messages"] == [SYSTEM, {"role": "user", "content": "."}, ANSWER, RESULT, QUESTION]
    assert base["messages"] == [SYSTEM, {"role": "user", "content": "."}, ANSWER]
    assert base["add_generation_prompt"] is False and full["tools"] == base["tools"] == TOOLS
    assert "add_generation_prompt" not in full  # the request's own (the default: the assistant opener)


def test_the_turn_close_is_added_where_the_model_did_not_sample_it() -> None:
    im_end, newline, endoftext = 2, 107, 3
    assert turn_glue([5, 6, im_end], (im_end, newline)) == [newline]
    assert turn_glue([5, 6], (im_end, newline)) == [im_end, newline]  # cut at max_tokens
    assert turn_glue([5, endoftext], (im_end, newline)) == [im_end, newline]  # another stop token
    assert common_suffix([1, 9, 35, 2, 107], [1, 9, 36, 2, 107]) == (2, 107)


async def test_the_memory_is_bounded_per_attempt_and_in_total() -> None:
    memory = ChainMemory(None, per_attempt=2, max_size=100)
    for i in range(3):
        memory.remember("r", "a", _entry(f"s{i}", [QUESTION] * (i + 1), ANSWER, prompt=20))
    assert memory.entries == 2 and memory.size <= 100
    for i in range(5):
        memory.remember(f"r{i}", "a", _entry(f"t{i}", [QUESTION], ANSWER, prompt=30))  # 34 each
    # The least recently used attempts went first; the size never passes the bound.
    assert memory.size <= 100 and memory.entries == 2
    body = {"messages": [QUESTION], "tools": TOOLS}
    assert [(await memory.link(f"r{i}", "a", body))[0].kind for i in (0, 3, 4)] == ["rendered", "retry", "retry"]
    with pytest.raises(ValueError, match="per_attempt"):
        ChainMemory(None, per_attempt=0)


async def test_a_retry_and_a_bridge_come_from_memory() -> None:
    memory = ChainMemory(None)
    memory.remember("r", "a", _entry("s1", [SYSTEM, QUESTION], ANSWER))
    retry, _ = await memory.link("r", "a", {"messages": [SYSTEM, QUESTION], "tools": TOOLS})
    bridged, keys = await memory.link("r", "a", {"messages": [SYSTEM, QUESTION, ANSWER, RESULT], "tools": TOOLS})
    other, _ = await memory.link("r", "b", {"messages": [SYSTEM, QUESTION], "tools": TOOLS})
    assert (retry.kind, bridged.kind, other.cause) == ("retry", "bridged", "first_call")
    # Only the messages after the parent's were digested; the keys are those of the whole request.
    assert keys == request_keys({"messages": [SYSTEM, QUESTION, ANSWER, RESULT], "tools": TOOLS})


async def test_the_quick_path_and_the_digests_agree_where_the_json_differs() -> None:
    memory = ChainMemory(None)
    memory.remember("r", "a", _entry("s1", [SYSTEM, QUESTION], ANSWER))
    # The client re-sent its history with content as text parts: not the same JSON, the same messages.
    parts = {"role": "user", "content": [{"type": "text", "text": QUESTION["content"]}]}
    bridged, _ = await memory.link("r", "a", {"messages": [SYSTEM, parts, ANSWER, RESULT], "tools": TOOLS})
    assert (bridged.kind, bridged.parent.span_id) == ("bridged", "s1")


def test_where_the_new_messages_start_in_the_rendering() -> None:
    close, text = (2, 107), "<|im_end|>"
    echoed = {"role": "assistant", "content": "Sunny."}
    base = [1, 5, 2, 107, 1, 9, 60, 61, 2, 107]  # system, dummy user, the echoed answer (last)
    new = [1, 7, 70, 2, 107, 1, 9]  # a user turn and the assistant opener
    assert new_messages_start(base + new, base, close, text, echoed) == len(base)
    # Qwen3 gives only the last answer an empty think block: the answer's turn ends at its first close.
    last = [1, 5, 2, 107, 1, 9, 40, 41, 60, 61, 2, 107]
    assert new_messages_start(base + new, last, close, text, echoed) == len(base)
    # Unless the answer's own text could hold that close, or the base does not end with it.
    assert new_messages_start(base + new, last, close, text, {"content": "a <|im_end|> b"}) is None
    assert new_messages_start(base + new, last[:-1], close, text, echoed) is None
    assert new_messages_start(base + new, last, close, "", echoed) is None


def test_where_the_echoed_answer_ends_when_it_renders_as_its_sampled_ids() -> None:
    close = (2, 107)
    head = (1, 5, 2, 107, 1, 8, 2, 107)  # system, dummy user
    parent_prompt = [1, 5, 2, 107, 1, 6, 2, 107, 1, 9]  # ... the assistant opener (1, 9)
    answer = [1, 9, 60, 61, 2, 107]  # opener, the sampled ids, the close
    new = [1, 7, 70, 2, 107, 1, 9]
    full = [*head, *answer, *new]
    assert echoed_answer_end(full, head, parent_prompt, [60, 61, 2], close) == len(head) + len(answer)
    assert echoed_answer_end(full, head, parent_prompt, [60, 61], close) == len(head) + len(answer)  # cut
    # Rendered otherwise than sampled (a dropped think block, tool calls written anew): not shown.
    assert echoed_answer_end(full, head, parent_prompt, [40, 41, 60, 61, 2], close) is None
    # The ids before the answer are not what its prompt ended with (a forced think block).
    assert echoed_answer_end(full, head, [*parent_prompt, 40], [60, 61, 2], close) is None
    # A head the rendering does not start with (another system message), or an empty answer.
    assert echoed_answer_end(full, (1, 4, 2, 107), parent_prompt, [60, 61, 2], close) is None
    assert echoed_answer_end(full, head, parent_prompt, [2], close) is None


def test_head_renderings_are_kept_per_head_request_and_bounded() -> None:
    heads = ChainHeads(max_entries=2, max_ids=8)
    request = {"messages": [SYSTEM, {"role": "user", "content": "."}], "tools": TOOLS, "add_generation_prompt": False}
    key = head_key("vllm-a", request)
    heads.put(key, [1, 5, 2])
    assert list(heads.get(head_key("vllm-a", {**request, "tools": list(TOOLS)}))) == [1, 5, 2]  # equal JSON
    # Another system message, other tools, another field or deployment: another head.
    changed = [
        {**request, "messages": [{"role": "system", "content": "Answer in French."}, request["messages"][1]]},
        {**request, "tools": []},
        {**request, "chat_template_kwargs": {"enable_thinking": False}},
    ]
    assert len({key, head_key("vllm-b", request), *(head_key("vllm-a", r) for r in changed)}) == 5
    assert all(heads.get(head_key("vllm-a", r)) is None for r in changed)
    heads.put(head_key("vllm-a", changed[0]), [1, 6, 2])
    assert list(heads.get(key)) == [1, 5, 2]  # used last: kept over the next one
    heads.put(head_key("vllm-a", changed[1]), [1, 7, 2])
    assert len(heads) == 2 and heads.get(head_key("vllm-a", changed[0])) is None
    # At most `max_ids` ids in all: the least recently used go first, a longer head is not kept.
    heads.put(head_key("vllm-a", changed[2]), [1, 8, 8, 2])
    assert len(heads) == 2 and heads.size == 7 and heads.get(key) is None
    heads.put(key, list(range(9)))
    assert heads.get(key) is None and heads.size == 7
    with pytest.raises(ValueError, match="max_entries"):
        ChainHeads(max_entries=0)


@pytest.mark.parametrize(
    "changed",
    [
        {"reasoning_effort": "high"},  # vLLM sets the template's enable_thinking from it
        {"tool_choice": "none"},
        {"response_format": {"type": "json_object"}},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"mm_processor_kwargs": {"max_pixels": 1024}},
    ],
)
async def test_a_re_ask_with_another_field_the_renderer_sees_is_no_retry(changed: dict[str, Any]) -> None:
    memory = ChainMemory(None)
    memory.remember("r", "a", _entry("s1", [SYSTEM, QUESTION], ANSWER))
    again, _ = await memory.link("r", "a", {"messages": [SYSTEM, QUESTION], "tools": TOOLS, **changed})
    follow_up, _ = await memory.link(
        "r", "a", {"messages": [SYSTEM, QUESTION, ANSWER, RESULT], "tools": TOOLS, **changed}
    )
    assert (again.kind, again.cause) == ("branched", "template_changed")
    assert (follow_up.kind, follow_up.cause) == ("branched", "template_changed")


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.mark.parametrize("where", ["history", "new"])
async def test_a_conversation_with_media_is_never_bridged(where: str) -> None:
    # The bridged prompt would keep the image's placeholder ids with no features for generate.
    seen = {"role": "user", "content": [{"type": "text", "text": "Weather here?"}, IMAGE]}
    history = [SYSTEM, seen] if where == "history" else [SYSTEM, QUESTION]
    new = {"role": "user", "content": [IMAGE]} if where == "new" else RESULT
    memory = ChainMemory(None)
    memory.remember("r", "a", _entry("s1", history, ANSWER))
    link, _ = await memory.link("r", "a", {"messages": [*history, ANSWER, new], "tools": TOOLS})
    assert (link.kind, link.cause, link.parent.span_id) == ("branched", "multimodal", "s1")
    repeat, _ = await memory.link("r", "a", {"messages": history, "tools": TOOLS})
    assert repeat.kind == "retry"  # the same render, features and all
