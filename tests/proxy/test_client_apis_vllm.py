"""The Responses and Anthropic Messages APIs in front of the real tiny vLLM, driven by their official SDKs.

Each call is served by vLLM's chat completions, so its span's token ids are exactly those of a
direct chat call of the same conversation; a client that replays its history gets prompt ids that
extend the previous call's prompt and response ids, so its calls merge into one trajectory.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.conversations import (
    anthropic_tool_messages,
    anthropic_tools,
    langchain_tool_conversation,
    messages,
    responses_tool_input,
    tool_history,
    tools,
)

from .helpers import model_entry, wait_for_spans

pytestmark = pytest.mark.vllm
MESSAGES, TOOL_HISTORY, TOOLS = messages(), tool_history(), tools()
FUNCTION = TOOLS[0]["function"]
PARAMETERS = FUNCTION["parameters"]
SAMPLING = {"temperature": 0}


@pytest.fixture
async def vllm_proxy(proxy_factory, vllm_server):
    return await proxy_factory([model_entry(vllm_server.model, vllm_server.base_url, backend_model=vllm_server.model)])


async def direct_chat(vllm_server: Any, chat_messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """The same conversation as a chat call straight to vLLM: (prompt ids, response ids, text)."""
    body = {"model": vllm_server.model, "messages": chat_messages, "return_token_ids": True, **SAMPLING, **fields}
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(vllm_server.base_url + "/chat/completions", json=body)
    response.raise_for_status()
    reply = response.json()
    choice = reply["choices"][0]
    return {"prompt": reply["prompt_token_ids"], "ids": choice["token_ids"], "text": choice["message"]["content"]}


def span_ids(span: Any) -> tuple[list[int], list[int]]:
    return span.attributes["agl.prompt_token_ids"], span.attributes["agl.choices"][0]["token_ids"]


async def test_responses_sdk_with_a_function_tool_and_its_result(vllm_proxy, vllm_server, new_rollout, store) -> None:
    ids = await new_rollout()
    client = openai.AsyncOpenAI(base_url=vllm_proxy.as_resource().get_base_url(*ids), api_key="-", max_retries=0)
    tool = {"type": "function", **FUNCTION}
    request: dict[str, Any] = {
        "model": vllm_server.model,
        "instructions": MESSAGES[0]["content"],
        "input": responses_tool_input(),
        "tools": [tool],
        "max_output_tokens": 8,
        **SAMPLING,
    }
    reply = await client.responses.create(**request)
    events = [event async for event in await client.responses.create(**request, stream=True)]
    await client.close()

    direct = await direct_chat(vllm_server, TOOL_HISTORY, tools=TOOLS, max_tokens=8)
    plain, streamed = await wait_for_spans(store, ids[0], 2)
    for span in (plain, streamed):
        assert span_ids(span) == (direct["prompt"], direct["ids"])
        assert span.attributes["agl.api"] == "responses"
        assert span.attributes["agl.request"]["input"] == request["input"]
    assert reply.output_text == direct["text"]
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.input_tokens == len(direct["prompt"]) and reply.usage.output_tokens == len(direct["ids"])
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == direct["text"]
    assert events[-1].response.output_text == direct["text"]


async def test_anthropic_sdk_create_and_stream_with_system_blocks_thinking_and_tools(
    vllm_proxy, vllm_server, new_rollout, store
) -> None:
    ids = await new_rollout()
    client = anthropic.AsyncAnthropic(base_url=rollout_root(vllm_proxy, ids), api_key="-", max_retries=0)
    request: dict[str, Any] = {
        "model": vllm_server.model,
        "system": [{"type": "text", "text": "You are a terse assistant."}, {"type": "text", "text": "Be brief."}],
        "messages": anthropic_tool_messages(thinking="The tool knows."),
        "tools": anthropic_tools(),
        "max_tokens": 8,
        # Anthropic's SDK has no sampling arguments any more; the API still takes them.
        "extra_body": SAMPLING,
    }
    reply = await client.messages.create(**request)
    async with client.messages.stream(**request) as stream:
        streamed_text = "".join([text async for text in stream.text_stream])
        final = await stream.get_final_message()
    counted = await client.messages.count_tokens(
        model=request["model"], system=request["system"], messages=request["messages"], tools=request["tools"]
    )
    models = await client.models.list()
    await client.close()

    # The conversation as chat: the system blocks joined, the thinking block as the assistant's reasoning.
    chat = [
        {"role": "system", "content": "You are a terse assistant.\n\nBe brief."},
        TOOL_HISTORY[1],
        {**TOOL_HISTORY[2], "reasoning": "The tool knows."},
        TOOL_HISTORY[3],
    ]
    direct = await direct_chat(vllm_server, chat, tools=TOOLS, max_tokens=8)
    plain, streamed = await wait_for_spans(store, ids[0], 2)
    for span in (plain, streamed):
        assert span_ids(span) == (direct["prompt"], direct["ids"])
        assert span.attributes["agl.api"] == "messages"
        assert span.attributes["agl.request"]["system"] == request["system"]
    assert [block.type for block in reply.content] == ["text"] and reply.content[0].text == direct["text"]
    assert reply.stop_reason == "max_tokens" and reply.usage.input_tokens == len(direct["prompt"])
    assert streamed_text == direct["text"] == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == len(direct["ids"])
    assert counted.input_tokens == len(direct["prompt"])
    assert vllm_server.model in [model.id for model in models.data]


async def test_replayed_histories_extend_the_previous_call(
    vllm_proxy, vllm_server, new_rollout, store, tokenizer
) -> None:
    ids = await new_rollout()
    claude = anthropic.AsyncAnthropic(base_url=rollout_root(vllm_proxy, ids), api_key="-", max_retries=0)
    oai = openai.AsyncOpenAI(base_url=vllm_proxy.as_resource().get_base_url(*ids), api_key="-", max_retries=0)
    question = {"role": "user", "content": MESSAGES[1]["content"]}
    follow_up = {"role": "user", "content": "And tomorrow?"}
    # Random weights say random tokens, whose text need not tokenize back to them (the same holds for
    # chat): vLLM's allowed_token_ids keep the answer to a word that does, and the end of the turn.
    rain = tokenizer.encode("rain", add_special_tokens=False)
    allowed = [*rain, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert tokenizer.encode("rain" * 4, add_special_tokens=False) == rain * 4
    fields: dict[str, Any] = {"model": vllm_server.model, "extra_body": {**SAMPLING, "allowed_token_ids": allowed}}

    first = await claude.messages.create(messages=[question], max_tokens=4, **fields)
    assistant = {"role": "assistant", "content": [block.model_dump() for block in first.content]}
    await claude.messages.create(messages=[question, assistant, follow_up], max_tokens=4, **fields)
    reply = await oai.responses.create(input=[question], max_output_tokens=4, **fields)
    replay = [question, *[item.model_dump(exclude_none=True) for item in reply.output], follow_up]
    await oai.responses.create(input=replay, max_output_tokens=4, **fields)
    await claude.close()
    await oai.close()

    spans = await wait_for_spans(store, ids[0], 4)
    for one, two in (spans[:2], spans[2:]):
        prompt, response = span_ids(one)
        assert response and set(response) <= set(allowed)
        assert span_ids(two)[0][: len(prompt) + len(response)] == prompt + response


async def test_langchain_agent_on_chat_anthropic(vllm_proxy, vllm_server, new_rollout, store, tokenizer) -> None:
    from langchain_anthropic import ChatAnthropic

    ids = await new_rollout()
    llm = ChatAnthropic(
        model=vllm_server.model, base_url=rollout_root(vllm_proxy, ids), api_key="-", max_tokens=8, **SAMPLING
    )
    first, chunks = await langchain_tool_conversation(llm)
    assert first.content is not None and chunks

    one, two = await wait_for_spans(store, ids[0], 2)
    assert span_ids(one) == tuple((await direct_chat(vllm_server, MESSAGES, tools=TOOLS, max_tokens=8)).values())[:2]
    assert (
        span_ids(two) == tuple((await direct_chat(vllm_server, TOOL_HISTORY, tools=TOOLS, max_tokens=8)).values())[:2]
    )
    assert two.attributes["agl.stream"] is True and two.attributes["agl.api"] == "messages"


def rollout_root(proxy: Any, ids: tuple[str, str]) -> str:
    """The per-rollout base URL as Anthropic's SDK takes it: without `/v1`, which the SDK adds."""
    return proxy.as_resource().get_base_url(*ids).removesuffix("/v1")
