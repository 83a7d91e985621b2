"""The Responses and Anthropic Messages APIs: what is refused (in each API's error shape), how a
failing backend reaches each API's clients, and how tool calls stream in each API's events.

The tests against the real model are in test_client_apis_vllm.py; a tiny random model never
makes a tool call, so the translation of one is shown here on a chat answer written out.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import orjson
import pytest

from agl_proxy.server.proxy import LLMProxy
from agl_proxy.translate.messages import MESSAGES
from agl_proxy.translate.responses import RESPONSES

from .fake_backend import WORDS, word_ids
from .helpers import model_entry, wait_for_spans

QUESTION = [{"role": "user", "content": "hi"}]
TOOL_CALL = {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}


PDF = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}}
DEEP: Any = "leaf"
for _ in range(400):  # deeper than the store keeps, and than orjson writes (an echo of it would fail)
    DEEP = {"a": DEEP}

REFUSED = [
    ("/messages", {"messages": QUESTION}, "max_tokens"),
    ("/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
     "messages[0].content[0].type"),
    ("/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": [PDF]}]},
     "messages[0].content[0].source.type"),
    ("/messages", {"max_tokens": 5, "messages": QUESTION, "tools": [{"type": "teleport_20990101", "name": "t"}]},
     "tools[0].type"),
    ("/messages", {"max_tokens": 5, "messages": QUESTION, "metadata": DEEP}, "metadata"),
    ("/messages", {"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ("/messages", {"max_tokens": 5, "messages": QUESTION, "tool_choice": {"type": "some"}}, "tool_choice.type"),
    ("/messages", {"max_tokens": 5, "system": [{"type": "image"}], "messages": QUESTION}, "system[0].type"),
    ("/messages", {"max_tokens": 5, "messages": QUESTION, "mcp_servers": [{"url": "x"}]}, "mcp_servers"),
    ("/messages/count_tokens", {"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
    ("/messages/count_tokens", {"messages": QUESTION, "model": 0}, "model"),
    ("/messages/count_tokens", {"messages": QUESTION, "model": None}, "model"),
    ("/messages/count_tokens", {"messages": QUESTION, "system": DEEP}, "system"),
    ("/responses", {"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ("/responses", {"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ("/responses", {"input": "hi", "tools": [{"type": "teleport"}]}, "tools[0].type"),
    ("/responses", {"input": "hi", "metadata": DEEP}, "metadata"),
    ("/responses", {"input": "hi", "temperature": "hot"}, "temperature"),
    ("/responses", {"input": "hi", "max_output_tokens": 2.5}, "max_output_tokens"),
    ("/responses", {"input": "hi", "stream": "yes"}, "stream"),
    ("/responses", {"input": "hi", "model": 0}, "model"),
    ("/responses", {"input": [{"type": ["message"]}]}, "input[0].type"),
    ("/responses", {"input": [{"role": {"user": 1}, "content": "hi"}]}, "input[0].role"),
    ("/responses", {"input": "hi", "tools": [{"type": {"function": 1}}]}, "tools[0].type"),
    ("/messages", {"max_tokens": "5", "messages": QUESTION}, "max_tokens"),
    ("/messages", {"max_tokens": 5, "messages": QUESTION, "top_k": True}, "top_k"),
    ("/messages", {"max_tokens": 5, "messages": QUESTION, "model": ["m"]}, "model"),
    ("/responses", {"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input[0].content[0].type"),
    ("/responses", {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ("/responses", {"input": 7}, "input"),
]  # fmt: skip


async def test_what_cannot_be_mapped_is_a_400_naming_the_field(proxy: LLMProxy, http, backend) -> None:
    for path, body, field in REFUSED:
        response = await http.post(proxy.base_url + path, json={"model": "tiny", **body})

        assert response.status_code == 400, (path, body)
        error = response.json()["error"]
        assert error["message"].startswith(field + ":"), (field, error)
        assert error["type"] == "invalid_request_error"
        if path.startswith("/messages"):  # Anthropic's shape; the Responses API's errors are OpenAI's
            assert response.json()["type"] == "error"
    assert backend[0].requests == []  # nothing reached the backend


async def test_anthropic_sdk_gets_its_own_exceptions(proxy: LLMProxy, backend) -> None:
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="-", max_retries=0)
    with pytest.raises(anthropic.NotFoundError, match="no-such-model"):
        await client.messages.create(model="no-such-model", max_tokens=5, messages=QUESTION)
    backend[0].mode = "reject400"
    with pytest.raises(anthropic.BadRequestError, match="prompt too long"):
        await client.messages.create(model="tiny", max_tokens=5, messages=QUESTION)
    backend[0].mode = "drop"
    with pytest.raises(anthropic.APIStatusError, match="dropped the stream"):
        async with client.messages.stream(model="tiny", max_tokens=5, messages=QUESTION) as stream:
            async for _ in stream:
                pass
    await client.close()


async def test_anthropic_sdks_send_their_key_as_x_api_key(proxy_factory, backend) -> None:
    proxy = await proxy_factory([model_entry("tiny", backend[1])], key="agent-key")
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="agent-key", max_retries=0)
    reply = await client.messages.create(model="tiny", max_tokens=5, messages=QUESTION)
    assert reply.content[0].text == "".join(WORDS)
    await client.close()
    wrong = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        await wrong.messages.create(model="tiny", max_tokens=5, messages=QUESTION)
    await wrong.close()


async def test_rollout_headers_attribute_translated_calls(new_rollout, proxy: LLMProxy, backend, store) -> None:
    ids = await new_rollout()
    headers = {"x-rollout-id": ids[0], "x-attempt-id": ids[1]}
    claude = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="-", max_retries=0, default_headers=headers)
    oai = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="-", max_retries=0, default_headers=headers)
    message = await claude.messages.create(model="tiny", max_tokens=5, messages=QUESTION)
    beta = await claude.beta.messages.create(model="tiny", max_tokens=5, messages=QUESTION)  # ?beta=true
    async with oai.responses.stream(model="tiny", input="hi") as stream:  # the SDK's accumulating helper
        events = [event.type async for event in stream]
        final = await stream.get_final_response()
    chat = await oai.chat.completions.create(model="tiny", messages=QUESTION)  # type: ignore[arg-type]
    await claude.close()
    await oai.close()

    assert message.content[0].text == beta.content[0].text == "".join(WORDS) == chat.choices[0].message.content
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert final.output_text == "".join(WORDS)
    spans = await wait_for_spans(store, ids[0], 4)
    assert [span.attributes["agl.api"] for span in spans] == ["messages", "messages", "responses", "chat.completions"]
    assert all(span.attributes["agl.choices"][0]["token_ids"] == word_ids(WORDS) for span in spans)
    assert spans[0].attributes["agl.request"] == {"model": "tiny", "max_tokens": 5, "messages": QUESTION}
    forwarded = backend[0].requests[2]
    assert forwarded["messages"] == [{"role": "user", "content": "hi"}] and forwarded["return_token_ids"] is True
    assert forwarded["stream_options"] == {"include_usage": True}


def chat_answer(**message: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "tool_calls"}
    return {"id": "chatcmpl-7", "created": 1, "model": "m", "choices": [choice], "prompt_token_ids": [1, 2, 3]}


def chunks_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat stream of `message` as vLLM sends one: reasoning, text, then the tool call's name and arguments."""
    base = {"id": "chatcmpl-7", "created": 1, "model": "m"}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}, {"reasoning": message["reasoning"]}]
    deltas += [{"content": word} for word in ("It ", "is.")]
    call = message["tool_calls"][0]
    deltas.append(
        {"tool_calls": [{"index": 0, "id": call["id"], "function": {"name": "get_weather", "arguments": ""}}]}
    )
    deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": part}}]} for part in ('{"city": ', '"Rome"}')]
    out = [{**base, "prompt_token_ids": [1, 2, 3], "choices": [{"index": 0, "delta": deltas[0]}]}]
    out += [{**base, "choices": [{"index": 0, "delta": delta}]} for delta in deltas[1:]]
    out.append({**base, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}})
    return out


def events(data: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for event in data for line in event.split(b"\n") if line.startswith(b"data: ")]


def test_a_tool_call_in_anthropic_messages_and_events() -> None:
    message = {"reasoning": "Weather wants a tool.", "content": "It is.", "tool_calls": [TOOL_CALL]}
    answer = chat_answer(**message)
    answer["usage"] = {"prompt_tokens": 3, "completion_tokens": 9}

    reply = MESSAGES.response(answer, {})
    assert reply["content"] == [
        {"type": "thinking", "thinking": "Weather wants a tool.", "signature": ""},
        {"type": "text", "text": "It is."},
        {"type": "tool_use", "id": "call_7", "name": "get_weather", "input": {"city": "Rome"}},
    ]
    assert reply["stop_reason"] == "tool_use" and reply["usage"] == {"input_tokens": 3, "output_tokens": 9}

    stream = MESSAGES.stream({})
    sent = [event for chunk in chunks_of(message) for event in stream.feed(chunk)] + stream.finish(answer)
    got = events(sent)
    assert [e["type"] for e in got] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    assert got[0]["message"]["usage"]["input_tokens"] == 3
    assert [e["content_block"]["type"] for e in got if e["type"] == "content_block_start"] == [
        "thinking", "text", "tool_use"
    ]  # fmt: skip
    json_parts = [e["delta"]["partial_json"] for e in got if e.get("delta", {}).get("type") == "input_json_delta"]
    assert "".join(json_parts) == '{"city": "Rome"}'
    assert got[-2]["delta"]["stop_reason"] == "tool_use" and got[-2]["usage"]["output_tokens"] == 9


def test_a_tool_call_in_responses_output_and_events() -> None:
    message = {"reasoning": "Weather wants a tool.", "content": "It is.", "tool_calls": [TOOL_CALL]}
    answer = chat_answer(**message)

    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    reply = RESPONSES.response(answer, {"tools": tools})
    assert [item["type"] for item in reply["output"]] == ["reasoning", "message", "function_call"]
    call = reply["output"][2]
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_7", "get_weather", '{"city": "Rome"}')
    assert reply["status"] == "completed" and reply["tools"] == tools

    stream = RESPONSES.stream({})
    sent = [event for chunk in chunks_of(message) for event in stream.feed(chunk)] + stream.finish(answer)
    got = events(sent)
    kinds = [e["type"] for e in got]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    done = [e["item"] for e in got if e["type"] == "response.output_item.done"]
    assert done == got[-1]["response"]["output"]  # the streamed items are the final response's
    arguments = [e["delta"] for e in got if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(arguments) == '{"city": "Rome"}'


REDACTED = {"type": "redacted_thinking", "data": "…"}  # encrypted: dropped


def test_histories_map_to_the_chat_messages_a_template_renders() -> None:
    history = MESSAGES.chat_request(
        {
            "model": "m",
            "max_tokens": 5,
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}]},
                {"role": "assistant", "content": [REDACTED, {"type": "text", "text": "Cat"}]},
                {"role": "user", "content": [{"type": "text", "text": "Sure?"}]},
            ],
        }
    )["messages"]  # fmt: skip
    assert history == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]},
        {"role": "assistant", "content": "Cat"},
        {"role": "user", "content": "Sure?"},
    ]
    turns = RESPONSES.chat_request(
        {
            "model": "m",
            "input": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "Weather?"},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Use the tool."}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
        }
    )["messages"]
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    assert turns == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning": "Use the tool.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
