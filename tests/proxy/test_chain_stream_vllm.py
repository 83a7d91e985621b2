"""A streamed chat call on the token chain is streamed as it is generated, against the real tiny vLLM.

The client's deltas come while the engine still generates; what they add up to (text and token
ids) is the greedy answer of a call that is not streamed, and the span records that answer;
`n` > 1 (which vLLM 0.31's streamed generate fails) is streamed once whole; a client that leaves
mid-stream stops the generation; with vLLM's hermes tool parser, the streamed tool calls and
content are the answer of a call that is not streamed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

from examples.tiny_vllm.pace import paced
from tests.support.conversations import messages, tools

from .helpers import model_entry, wait_for_spans
from .test_token_chain_vllm import _client, _generated_tokens

pytestmark = pytest.mark.vllm
# Paced (examples/tiny_vllm/pace.py): a generation slower than the client's own requests, whatever the load.
LONG: dict[str, Any] = {
    "temperature": 0,
    "max_tokens": 200,
    "extra_body": {"ignore_eos": True, "vllm_xargs": paced(0.02)},
}


async def test_a_streamed_answer_comes_as_it_is_generated_and_is_the_greedy_answer(
    chain_proxy, vllm_server, new_rollout, store
) -> None:
    ids = await new_rollout()
    client = _client(chain_proxy, ids)
    stream = await client.chat.completions.create(
        model=vllm_server.model, messages=messages(), stream=True, stream_options={"include_usage": True}, **LONG
    )
    chunks = [chunk async for chunk in stream]
    whole = await client.chat.completions.create(model=vllm_server.model, messages=messages(), **LONG)
    await client.close()

    first = chunks[0]
    assert first.choices[0].delta.role == "assistant"
    assert first.model_extra["prompt_token_ids"] == whole.model_extra["prompt_token_ids"]
    deltas = [c for c in chunks if c.choices and c.choices[0].finish_reason is None]
    streamed_ids = [i for c in deltas for i in c.choices[0].model_extra["token_ids"]]
    text = "".join(c.choices[0].delta.content or "" for c in deltas)
    assert streamed_ids == whole.choices[0].model_extra["token_ids"]
    assert len(streamed_ids) == 200
    # Sent as the ids came: several deltas (the leaving client's test shows the first comes before the last id).
    assert len(first.choices[0].model_extra["token_ids"]) < 200
    assert sum(1 for c in deltas if c.choices[0].delta.content) > 1
    assert text == whole.choices[0].message.content
    [end] = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert end.choices[0].finish_reason == whole.choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 200
    assert chunks[-1].usage.prompt_tokens == len(whole.model_extra["prompt_token_ids"])

    span, other = await wait_for_spans(store, ids[0], 2)
    assert span.attributes["agl.stream"] is True
    assert span.attributes["agl.ttft_s"] is not None
    assert (
        span.attributes["agl.response"]["choices"][0]["message"]
        == other.attributes["agl.response"]["choices"][0]["message"]
    )
    assert span.attributes["agl.choices"][0]["token_ids"] == streamed_ids
    assert len(span.attributes["agl.choices"][0]["logprobs"]) == 200
    assert span.attributes["agl.prompt_token_ids"] == other.attributes["agl.prompt_token_ids"]


async def test_n_2_is_streamed_once_whole(chain_proxy, vllm_server, new_rollout, store) -> None:
    ids = await new_rollout()
    client = _client(chain_proxy, ids)
    stream = await client.chat.completions.create(
        model=vllm_server.model, messages=messages(), stream=True, n=2, temperature=1.0, max_tokens=24
    )
    texts, token_ids, finish = ["", ""], [[], []], [None, None]
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            token_ids[choice.index] += (choice.model_extra or {}).get("token_ids") or []
            finish[choice.index] = choice.finish_reason or finish[choice.index]
    await client.close()

    [span] = await wait_for_spans(store, ids[0], 1)
    recorded = span.attributes["agl.response"]["choices"]
    assert [c["message"]["content"] for c in recorded] == texts
    assert [c["token_ids"] for c in span.attributes["agl.choices"]] == token_ids
    assert [c["finish_reason"] for c in recorded] == finish


async def test_a_client_that_leaves_mid_stream_stops_the_generation(
    chain_proxy, vllm_server, new_rollout, store
) -> None:
    """It leaves at the first delta, which came before the generation was done: vLLM generated less than asked."""
    ids = await new_rollout()
    async with httpx.AsyncClient(timeout=30) as http:
        before = await _generated_tokens(http, vllm_server)
        client = _client(chain_proxy, ids)
        stream = await client.chat.completions.create(
            model=vllm_server.model, messages=messages(), stream=True, temperature=1.0, max_tokens=400,
            extra_body={"ignore_eos": True, "vllm_xargs": paced(0.02)},
        )  # fmt: skip
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await stream.close()
        await client.close()
        [span] = await wait_for_spans(store, ids[0], 1)
        await asyncio.sleep(1.0)  # what vLLM would still generate, had it not aborted
        generated = await _generated_tokens(http, vllm_server) - before

    assert span.attributes["agl.error"]["type"] == "client_disconnected"
    assert generated < 400


def _assembled(chunks: list[Any]) -> dict[str, Any]:
    """The answer a client puts together from a stream's chunks."""
    content, ids, calls, finish = "", [], {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            ids += (choice.model_extra or {}).get("token_ids") or []
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or ():
                name, arguments, call_id = calls.get(call.index, ("", "", None))
                function = call.function
                calls[call.index] = (
                    name + (function.name or ""),
                    arguments + (function.arguments or ""),
                    call.id or call_id,
                )
    return {"content": content, "token_ids": ids, "tool_calls": [calls[i] for i in sorted(calls)], "finish": finish}


async def test_hermes_tool_calls_stream_as_vllm_s_own_chat_endpoint_streams_them(
    proxy_factory, real_vllm_server, new_rollout, store
) -> None:
    """The deltas of the chain's streamed derenders (ids batched) add up to those of vLLM's streamed chat; the span
    keeps the answer the non-streamed derender parses (the whole answer's parse, which for a cut answer can differ
    from what the stream parsed: vLLM's own two endpoints differ alike)."""
    entry = [model_entry(real_vllm_server.model, real_vllm_server.base_url, backend_model=real_vllm_server.model)]
    chain = await proxy_factory(entry, logprobs=True)
    vllm_s_own = await proxy_factory(entry, token_chain="off")
    ids = await new_rollout()
    clients = [_client(chain, ids), openai.AsyncOpenAI(base_url=vllm_s_own.url + "/v1", api_key="-", max_retries=0)]
    sampling: dict[str, Any] = {"temperature": 0, "max_tokens": 64, "tools": tools()}
    streamed: list[dict[str, Any]] = []
    for tool_choice in ("required", "auto"):
        both = []
        for client in clients:
            stream = await client.chat.completions.create(
                model=real_vllm_server.model, messages=messages(), stream=True, tool_choice=tool_choice, **sampling
            )
            both.append(_assembled([chunk async for chunk in stream]))
        mine, theirs = both
        assert mine["token_ids"] == theirs["token_ids"]
        assert mine["content"] == theirs["content"]
        assert [c[:2] for c in mine["tool_calls"]] == [c[:2] for c in theirs["tool_calls"]]
        assert mine["finish"] == theirs["finish"]
        streamed.append(mine)
        await clients[0].chat.completions.create(
            model=real_vllm_server.model, messages=messages(), tool_choice=tool_choice, **sampling
        )
    for client in clients:
        await client.close()

    assert streamed[0]["tool_calls"], "the required tool calls are streamed"
    spans = await wait_for_spans(store, ids[0], 4)
    for answer, span, whole in zip(streamed, spans[0::2], spans[1::2], strict=True):
        [recorded] = span.attributes["agl.response"]["choices"]
        [parsed] = whole.attributes["agl.response"]["choices"]
        assert span.attributes["agl.choices"][0]["token_ids"] == answer["token_ids"]
        calls = recorded["message"].get("tool_calls") or []
        assert [c["function"] for c in calls] == [c["function"] for c in parsed["message"].get("tool_calls") or []]
        assert {**recorded["message"], "tool_calls": None} == {**parsed["message"], "tool_calls": None}
        assert recorded["finish_reason"] == parsed["finish_reason"]
        if len(calls) == len(answer["tool_calls"]):
            # The span's tool calls have the ids the client was streamed.
            assert [c["id"] for c in calls] == [c[2] for c in answer["tool_calls"]]
