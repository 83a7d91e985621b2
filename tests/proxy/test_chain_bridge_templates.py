"""Where a bridge's new messages start, on the real chat templates (Qwen2.5 with hermes tool calls,
Qwen3 with its reasoning) and the real vocabulary: the one-render answer (`echoed_answer_end`,
from the head's rendering and the answer's sampled ids) is the two-render one
(`new_messages_start`, from the echoed answer rendered alone), or None, never another place; and
whether the template only appends once the new messages follow (the echoed answer rendered alone
a prefix of it followed), which a deployment whose reasoning follows the template needs to bridge."""

from __future__ import annotations

from typing import Any

import pytest

from agl_proxy.chain.bridging import echoed_answer_end, keeps_head, new_messages_start
from examples.tiny_vllm.real_vocab import QWEN2_5, QWEN3
from tests.support.conversations import TOOL_RESULT, tools

SYSTEM = {"role": "system", "content": "You are a weather agent."}
DUMMY = {"role": "user", "content": "."}
QUESTION = {"role": "user", "content": "How is the weather in Paris?"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# As vLLM hands them to the template: the arguments' JSON string parsed (`chat_utils`).
TOOL_CALLS = [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
REASONING = "The user wants Paris."

# (template, what the model sampled, the answer as the client echoes it, the new messages, one render shows it,
#  the template only appends)
CASES = [
    ("qwen2.5", "Sunny, 21 degrees.", {"content": "Sunny, 21 degrees."}, [QUESTION], True, True),
    (
        "qwen2.5",
        CALL,
        {"content": None, "tool_calls": TOOL_CALLS},
        [{"role": "tool", "content": TOOL_RESULT}],
        True,
        True,
    ),
    # Rendered as the last answer it has an empty think block, which goes once more follows; the
    # model sampled none, so the whole conversation renders as the bridge makes it.
    ("qwen3", "Sunny, 21 degrees.", {"content": "Sunny, 21 degrees."}, [QUESTION], True, False),
    (
        "qwen3",
        f"<think>\n{REASONING}\n</think>\n\nSunny.",
        {"content": "Sunny.", "reasoning_content": REASONING},
        [QUESTION],
        False,  # the template drops the earlier turn's reasoning at a new user turn
        False,
    ),
    (
        "qwen3",
        f"<think>\n{REASONING}\n</think>\n\n{CALL}",
        {"content": "", "reasoning_content": REASONING, "tool_calls": TOOL_CALLS},
        [{"role": "tool", "content": TOOL_RESULT}],
        True,  # reasoning kept: no user turn since
        True,
    ),
]


def _ids(tokenizer: Any, template: str, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, tools=tools(), chat_template=template, add_generation_prompt=generation_prompt, return_dict=False
        )
    )


@pytest.mark.parametrize(("flavour", "sampled", "echoed", "new", "shown", "appends"), CASES)
def test_one_render_finds_the_new_messages_where_two_do(
    real_tokenizer, flavour, sampled, echoed, new, shown, appends
) -> None:
    template = (QWEN2_5 if flavour == "qwen2.5" else QWEN3).template.read_text()
    im_end, newline = real_tokenizer.convert_tokens_to_ids("<|im_end|>"), real_tokenizer.encode("\n")[0]
    close = (im_end, newline)
    answer = {"role": "assistant", **echoed}
    head = _ids(real_tokenizer, template, [SYSTEM, DUMMY], False)
    base = _ids(real_tokenizer, template, [SYSTEM, DUMMY, answer], False)
    full = _ids(real_tokenizer, template, [SYSTEM, DUMMY, answer, *new], True)
    parent_prompt = _ids(real_tokenizer, template, [SYSTEM, QUESTION], True)
    response_ids = [*real_tokenizer.encode(sampled), im_end]

    two = new_messages_start(full, base, close, "<|im_end|>", answer)
    one = echoed_answer_end(full, tuple(head), parent_prompt, response_ids, close)
    assert two is not None
    assert one in (None, two)
    assert (one is not None) is shown
    assert keeps_head(full, head) and keeps_head(base, head)
    assert (full[: len(base)] == base) is appends
