"""The token chain under the Responses API and Anthropic Messages, driven by their official SDKs
against the real tiny vLLM (started with --enable-scale-out).

A tool agent's history (a function call and its result, replayed: the tiny model makes none) is
answered; the agent appends what the SDK returned (output items, content blocks) and a new user
turn, twice. Both follow-ups are bridged like chat's: each prompt is its parent's prompt ids and
answer ids, then only what the new messages add.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.conversations import anthropic_tool_messages, anthropic_tools, messages, responses_tool_input, tools

from .helpers import model_entry, wait_for_spans

pytestmark = pytest.mark.vllm
SAMPLING: dict[str, Any] = {"temperature": 1.0}
MAX_TOKENS = 8
CALLS = 3


Settle = Callable[[int], Awaitable[None]]
"""Awaited after each call (its number, from 1): a fleet test waits there for the call's span."""


def _nudge(turn: int) -> dict[str, Any]:
    return {"role": "user", "content": f"Call get_weather for city number {turn}."}


async def _no_wait(calls: int) -> None:
    return None


async def _responses_agent(
    clients: Sequence[openai.AsyncOpenAI], model: str, stream: bool, settle: Settle = _no_wait
) -> list[Any]:
    """CALLS calls, made in turn through `clients`; each next input is the last one's, the response's
    output items, a new user turn."""
    items = responses_tool_input()
    answers = []
    for turn in range(CALLS):
        client = clients[turn % len(clients)]
        request: dict[str, Any] = {
            "model": model,
            "instructions": messages()[0]["content"],
            "input": items,
            "tools": [{"type": "function", **tools()[0]["function"]}],
            "max_output_tokens": MAX_TOKENS,
            "extra_body": SAMPLING,
        }
        if stream:
            events = [event async for event in await client.responses.create(**request, stream=True)]
            response = events[-1].response
        else:
            response = await client.responses.create(**request)
        answers.append(response)
        await settle(turn + 1)
        items = [*items, *[item.model_dump(exclude_none=True) for item in response.output], _nudge(turn)]
    return answers


async def _messages_agent(
    clients: Sequence[anthropic.AsyncAnthropic], model: str, stream: bool, settle: Settle = _no_wait
) -> list[Any]:
    """CALLS calls, made in turn through `clients`; each next history is the last one's, the answer's
    content blocks, a new user turn."""
    history = anthropic_tool_messages(thinking="The tool knows.")
    answers = []
    for turn in range(CALLS):
        client = clients[turn % len(clients)]
        request: dict[str, Any] = {
            "model": model,
            "system": messages()[0]["content"],
            "messages": history,
            "tools": anthropic_tools(),
            "max_tokens": MAX_TOKENS,
            "extra_body": SAMPLING,
        }
        if stream:
            async with client.messages.stream(**request) as events:
                answer = await events.get_final_message()
        else:
            answer = await client.messages.create(**request)
        answers.append(answer)
        await settle(turn + 1)
        blocks = [block.model_dump(exclude_none=True) for block in answer.content]
        history = [*history, {"role": "assistant", "content": blocks}, _nudge(turn)]
    return answers


def _assert_chain(spans: Any, answers: list[Any], api: str, stream: bool) -> None:
    """The first call rendered whole, each later one bridged from the call before it."""
    for span, answer in zip(spans, answers, strict=True):
        assert span.attributes["agl.api"] == api and span.attributes["agl.stream"] is stream
        assert answer.usage.output_tokens == len(span.attributes["agl.choices"][0]["token_ids"])
    assert spans[0].attributes["agl.chain"]["prompt"] == "rendered"
    for parent, span in zip(spans, spans[1:], strict=False):
        assert span.attributes["agl.chain"] == {
            "prompt": "bridged",
            "parent": parent.span_id,
            "choice": 0,
            "cause": None,
        }
        prefix = parent.attributes["agl.prompt_token_ids"] + parent.attributes["agl.choices"][0]["token_ids"]
        assert span.attributes["agl.prompt_token_ids"][: len(prefix)] == prefix


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_responses_api_follow_ups_are_bridged(chain_proxy, vllm_server, new_rollout, store, stream) -> None:
    ids = await new_rollout()
    async with openai.AsyncOpenAI(
        base_url=chain_proxy.as_resource().get_base_url(*ids), api_key="-", max_retries=0
    ) as client:
        answers = await _responses_agent([client], vllm_server.model, stream)

    spans = await wait_for_spans(store, ids[0], CALLS)
    _assert_chain(spans, answers, "responses", stream)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_anthropic_messages_follow_ups_are_bridged(chain_proxy, vllm_server, new_rollout, store, stream) -> None:
    ids = await new_rollout()
    root = chain_proxy.as_resource().get_base_url(*ids).removesuffix("/v1")
    async with anthropic.AsyncAnthropic(base_url=root, api_key="-", max_retries=0) as client:
        answers = await _messages_agent([client], vllm_server.model, stream)

    spans = await wait_for_spans(store, ids[0], CALLS)
    _assert_chain(spans, answers, "messages", stream)


async def test_two_proxies_of_a_fleet_bridge_responses_and_messages_calls_that_alternate_between_them(
    proxy_factory, vllm_server, new_rollout, store
) -> None:
    """Each proxy reads the calls the other served from the store, the client's request translated to chat
    again: a follow-up is bridged whichever proxy answered the call before it."""
    entry = [model_entry(vllm_server.model, vllm_server.base_url, backend_model=vllm_server.model)]
    fleet = [await proxy_factory(entry, logprobs=True) for _ in range(2)]

    ids = await new_rollout()

    async def span_stored(calls: int) -> None:  # the next call goes to the other proxy once this one's span is in
        await wait_for_spans(store, ids[0], calls)

    async with (
        openai.AsyncOpenAI(base_url=fleet[0].as_resource().get_base_url(*ids), api_key="-") as first,
        openai.AsyncOpenAI(base_url=fleet[1].as_resource().get_base_url(*ids), api_key="-") as second,
    ):
        answers = await _responses_agent([first, second], vllm_server.model, False, span_stored)
    _assert_chain(await wait_for_spans(store, ids[0], CALLS), answers, "responses", False)

    ids = await new_rollout()
    roots = [proxy.as_resource().get_base_url(*ids).removesuffix("/v1") for proxy in fleet]
    async with (
        anthropic.AsyncAnthropic(base_url=roots[0], api_key="-") as first,
        anthropic.AsyncAnthropic(base_url=roots[1], api_key="-") as second,
    ):
        answers = await _messages_agent([first, second], vllm_server.model, False, span_stored)
    _assert_chain(await wait_for_spans(store, ids[0], CALLS), answers, "messages", False)


@pytest.mark.parametrize("under", [None, 8], ids=["over-the-context", "just-under-it"])
async def test_a_token_limit_the_prompt_does_not_fit_beside_gets_what_the_context_leaves(
    chain_proxy, vllm_server, new_rollout, store, under: int | None
) -> None:
    """Agents size `max_tokens` for their own models (Claude Code sends 64,000 or 128,000). vLLM reserves
    the limit before it reads the prompt and refuses a prompt that does not fit beside it (a limit over
    its context outright), so the proxy lets such a call generate what the context leaves after the prompt."""
    async with httpx.AsyncClient() as http:
        [card] = (await http.get(f"{vllm_server.base_url}/models")).json()["data"]
    limit = 128_000 if under is None else card["max_model_len"] - under
    ids = await new_rollout()
    root = chain_proxy.as_resource().get_base_url(*ids).removesuffix("/v1")
    long_prompt = "Tell me about the weather in every city you know. " * 4  # more than `under` tokens
    async with anthropic.AsyncAnthropic(base_url=root, api_key="-", max_retries=0) as client:
        request = {
            "model": vllm_server.model,
            "messages": [{"role": "user", "content": long_prompt}],
            "max_tokens": limit,
        }
        async with client.messages.stream(**request) as events:  # the SDK streams a call this long, as Claude Code
            answer = await events.get_final_message()

    [span] = await wait_for_spans(store, ids[0], 1)
    prompt, generated = len(span.attributes["agl.prompt_token_ids"]), answer.usage.output_tokens
    assert prompt + generated == card["max_model_len"]
    assert answer.stop_reason == "end_turn"  # cut by the context, short of the agent's own limit
