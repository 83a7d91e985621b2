"""The proxy in front of the real tiny vLLM, driven by the OpenAI SDK and LangChain.

In every case the span's token ids are exactly what vLLM returned, streamed ids equal
non-streamed ids at temperature 0, and chat prompt ids equal the local tokenizer's
chat-template ids.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.conversations import TOOL_RESULT, messages, tool_history, tools
from tests.test_environment import chat_template_ids

from .helpers import model_entry, wait_for_spans

pytestmark = pytest.mark.vllm
MESSAGES, TOOL_HISTORY, TOOLS = messages(), tool_history(), tools()
SAMPLING = {"temperature": 0, "max_tokens": 8}


@pytest.fixture
async def vllm_proxy(proxy_factory, vllm_server):
    return await proxy_factory(
        [model_entry(vllm_server.model, vllm_server.base_url, backend_model=vllm_server.model)], logprobs=True
    )


async def _client(proxy, ids) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.as_resource().get_base_url(*ids), api_key="unused", max_retries=0)


async def test_chat_stream_and_not_record_the_same_exact_ids(
    vllm_proxy, vllm_server, new_rollout, store, tokenizer
) -> None:
    ids = await new_rollout()
    client = await _client(vllm_proxy, ids)
    reply = await client.chat.completions.create(model=vllm_server.model, messages=MESSAGES, **SAMPLING)
    streamed_text = ""
    stream = await client.chat.completions.create(model=vllm_server.model, messages=MESSAGES, stream=True, **SAMPLING)
    async for chunk in stream:
        streamed_text += "".join(c.delta.content or "" for c in chunk.choices)
    await client.close()

    plain, streamed = await wait_for_spans(store, ids[0], 2)
    returned_ids = reply.model_extra["prompt_token_ids"]
    assert plain.attributes["agl.prompt_token_ids"] == returned_ids == chat_template_ids(tokenizer, MESSAGES)
    assert plain.attributes["agl.choices"][0]["token_ids"] == reply.choices[0].model_extra["token_ids"]
    assert streamed.attributes["agl.prompt_token_ids"] == returned_ids
    assert streamed.attributes["agl.choices"][0]["token_ids"] == plain.attributes["agl.choices"][0]["token_ids"]
    assert (
        streamed.attributes["agl.response"]["choices"][0]["message"]["content"]
        == streamed_text
        == reply.choices[0].message.content
    )
    for span in (plain, streamed):
        choice = span.attributes["agl.choices"][0]
        assert len(choice["logprobs"]) == len(choice["token_ids"]) == span.attributes["gen_ai.usage.output_tokens"]
        assert span.attributes["agl.token_ids.status"] == "ok"  # vLLM's ids agree with its usage
    assert [plain.sequence_id, streamed.sequence_id] == [1, 2]


async def test_completions_with_token_id_prompts(vllm_proxy, vllm_server, new_rollout, store) -> None:
    ids = await new_rollout()
    client = await _client(vllm_proxy, ids)
    prompt = [1, 228, 107, 506]
    reply = await client.completions.create(model=vllm_server.model, prompt=prompt, **SAMPLING)
    stream = await client.completions.create(model=vllm_server.model, prompt=prompt, stream=True, **SAMPLING)
    text = "".join([chunk.choices[0].text async for chunk in stream])
    await client.close()

    plain, streamed = await wait_for_spans(store, ids[0], 2)
    assert plain.attributes["agl.prompt_token_ids"] == streamed.attributes["agl.prompt_token_ids"] == prompt
    assert plain.attributes["agl.choices"][0]["token_ids"] == reply.choices[0].model_extra["token_ids"]
    assert streamed.attributes["agl.choices"][0]["token_ids"] == plain.attributes["agl.choices"][0]["token_ids"]
    assert streamed.attributes["agl.response"]["choices"][0]["text"] == text == reply.choices[0].text
    assert len(plain.attributes["agl.choices"][0]["logprobs"]) == len(reply.choices[0].model_extra["token_ids"])
    assert plain.attributes["agl.token_ids.status"] == streamed.attributes["agl.token_ids.status"] == "ok"


async def test_langchain_agent_with_a_tool_conversation(vllm_proxy, vllm_server, new_rollout, store, tokenizer) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    ids = await new_rollout()
    llm = ChatOpenAI(
        base_url=vllm_proxy.as_resource().get_base_url(*ids), api_key="unused", model=vllm_server.model, **SAMPLING
    )
    agent = llm.bind_tools(TOOLS)
    history: list[Any] = [SystemMessage(MESSAGES[0]["content"]), HumanMessage(MESSAGES[1]["content"])]
    first = await agent.ainvoke(history)
    history += [
        AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}]),
        ToolMessage(content=TOOL_RESULT, tool_call_id="call_1"),
    ]
    chunks = [chunk async for chunk in agent.astream(history)]
    await llm.root_async_client.close()
    assert first.content is not None and chunks

    one, two = await wait_for_spans(store, ids[0], 2)
    assert one.attributes["agl.prompt_token_ids"] == chat_template_ids(tokenizer, MESSAGES, tools=TOOLS)
    assert two.attributes["agl.prompt_token_ids"] == chat_template_ids(tokenizer, TOOL_HISTORY, tools=TOOLS)
    assert two.attributes["agl.stream"] is True and two.attributes["agl.choices"][0]["token_ids"]
    assert two.attributes["agl.request"]["tools"] == TOOLS
    assert [one.sequence_id, two.sequence_id] == [1, 2]
