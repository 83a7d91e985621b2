"""The token chain against the real tiny vLLM (started with --enable-scale-out), driven by the OpenAI SDK.

A tool agent's follow-up calls are bridged: each prompt is the previous call's exact prompt ids, its
answer's ids, the template's turn close, and only the new messages rendered; streamed or not, `n` > 1,
an edited history (branched, with its cause) and an identical retry (its prompt ids reused).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agl_store.client import LightningStoreClient
from tests.support.conversations import TOOL_RESULT, messages, tools
from tests.test_environment import chat_template_ids

from .helpers import model_entry, vllm_metric, wait_for_spans
from .test_cli import _start, _stop
from .test_store_server import _store_server

pytestmark = pytest.mark.vllm
SAMPLING: dict[str, Any] = {"temperature": 1.0, "max_tokens": 8}
RENDERED_FIRST = {"prompt": "rendered", "parent": None, "choice": None, "cause": "first_call"}


def _client(proxy, ids) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.as_resource().get_base_url(*ids), api_key="unused", max_retries=0)


def _echo(message: Any) -> dict[str, Any]:
    """The answer as an agent appends it to its history."""
    return message.model_dump(exclude_none=True)


def _observations(message: dict[str, Any], turn: int) -> list[dict[str, Any]]:
    """What the tool agent adds after an answer: each tool call's result, else a user nudge."""
    calls = message.get("tool_calls") or []
    if calls:
        return [{"role": "tool", "tool_call_id": c["id"], "content": TOOL_RESULT} for c in calls]
    return [{"role": "user", "content": f"Call get_weather for city number {turn}."}]


async def _tool_agent(client: openai.AsyncOpenAI, model: str, calls: int, stream: bool = False) -> list[Any]:
    history = messages()
    answers = []
    for turn in range(calls):
        if stream:
            chunks = await client.chat.completions.create(
                model=model, messages=history, tools=tools(), stream=True, **SAMPLING
            )
            content = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
            message: dict[str, Any] = {"role": "assistant", "content": content}
        else:
            reply = await client.chat.completions.create(model=model, messages=history, tools=tools(), **SAMPLING)
            message = _echo(reply.choices[0].message)
        answers.append(message)
        history = [*history, message, *_observations(message, turn)]
    return answers


def _assert_bridged(span: Any, parent: Any, tokenizer: Any, choice: int = 0) -> None:
    chain = span.attributes["agl.chain"]
    assert chain == {"prompt": "bridged", "parent": parent.span_id, "choice": choice, "cause": None}
    parent_ids = parent.attributes["agl.prompt_token_ids"]
    response_ids = parent.attributes["agl.choices"][choice]["token_ids"]
    prompt_ids = span.attributes["agl.prompt_token_ids"]
    assert prompt_ids[: len(parent_ids) + len(response_ids)] == parent_ids + response_ids
    inserted = prompt_ids[len(parent_ids) + len(response_ids) :]
    im_end, newline = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.encode("\n")
    # Cut at max_tokens, the answer gets the turn close the model did not sample; then only the new messages.
    glue = [newline[0]] if response_ids[-1] == im_end else [im_end, *newline]
    assert inserted[: len(glue)] == glue
    # What follows is the template's own rendering of the new messages and the assistant opener.
    whole = chat_template_ids(tokenizer, span.attributes["agl.request"]["messages"], tools=tools())
    assert whole[-(len(inserted) - len(glue)) :] == inserted[len(glue) :]


async def test_a_tool_agent_s_follow_ups_are_bridged(chain_proxy, vllm_server, new_rollout, store, tokenizer) -> None:
    ids = await new_rollout()
    client = _client(chain_proxy, ids)
    answers = await _tool_agent(client, vllm_server.model, calls=3)
    await client.close()

    first, second, third = await wait_for_spans(store, ids[0], 3)
    assert first.attributes["agl.chain"] == RENDERED_FIRST
    assert first.attributes["agl.prompt_token_ids"] == chat_template_ids(tokenizer, messages(), tools=tools())
    _assert_bridged(second, first, tokenizer)
    _assert_bridged(third, second, tokenizer)
    for span, answer in zip((first, second, third), answers, strict=True):
        assert span.attributes["agl.token_ids.status"] == "ok"
        choice = span.attributes["agl.choices"][0]
        assert len(choice["logprobs"]) == len(choice["token_ids"]) == span.attributes["gen_ai.usage.output_tokens"]
        assert span.attributes["agl.response"]["choices"][0]["message"]["content"] == answer.get("content")
        assert span.attributes["gen_ai.usage.input_tokens"] == len(span.attributes["agl.prompt_token_ids"])


async def test_streamed_follow_ups_are_bridged_too(chain_proxy, vllm_server, new_rollout, store, tokenizer) -> None:
    ids = await new_rollout()
    client = _client(chain_proxy, ids)
    answers = await _tool_agent(client, vllm_server.model, calls=2, stream=True)
    await client.close()

    first, second = await wait_for_spans(store, ids[0], 2)
    _assert_bridged(second, first, tokenizer)
    assert second.attributes["agl.stream"] is True
    assert first.attributes["agl.response"]["choices"][0]["message"]["content"] == answers[0]["content"]


async def test_n_2_the_follow_up_continues_the_choice_the_agent_kept(
    chain_proxy, vllm_server, new_rollout, store, tokenizer
) -> None:
    ids = await new_rollout()
    client = _client(chain_proxy, ids)
    reply = await client.chat.completions.create(model=vllm_server.model, messages=messages(), n=2, **SAMPLING)
    kept = _echo(reply.choices[1].message)
    history = [*messages(), kept, {"role": "user", "content": "And tomorrow?"}]
    await client.chat.completions.create(model=vllm_server.model, messages=history, **SAMPLING)
    await client.close()

    first, second = await wait_for_spans(store, ids[0], 2)
    assert len(first.attributes["agl.choices"]) == 2
    if reply.choices[0].message.content != reply.choices[1].message.content:
        _assert_bridged(second, first, tokenizer, choice=1)


async def test_an_edited_history_branches_and_a_repeat_is_a_retry(
    chain_proxy, vllm_server, new_rollout, store, tokenizer
) -> None:
    ids = await new_rollout()
    client = _client(chain_proxy, ids)
    reply = await client.chat.completions.create(model=vllm_server.model, messages=messages(), **SAMPLING)
    history = [*messages(), _echo(reply.choices[0].message), {"role": "user", "content": "And tomorrow?"}]
    await client.chat.completions.create(model=vllm_server.model, messages=history, **SAMPLING)
    repeat = await client.chat.completions.create(model=vllm_server.model, messages=history, **SAMPLING)
    edited = [{"role": "system", "content": "You are a verbose assistant."}, *history[1:]]
    await client.chat.completions.create(model=vllm_server.model, messages=edited, **SAMPLING)
    changed = [*messages(), {"role": "assistant", "content": "It is sunny."}, history[-1]]
    await client.chat.completions.create(model=vllm_server.model, messages=changed, **SAMPLING)
    await client.close()

    first, second, third, fourth, fifth = await wait_for_spans(store, ids[0], 5)
    assert second.attributes["agl.chain"]["prompt"] == "bridged"
    assert third.attributes["agl.chain"] == {"prompt": "retry", "parent": second.span_id, "choice": None, "cause": None}
    assert third.attributes["agl.prompt_token_ids"] == second.attributes["agl.prompt_token_ids"]
    assert repeat.model_extra["prompt_token_ids"] == second.attributes["agl.prompt_token_ids"]
    assert fourth.attributes["agl.chain"] == {
        "prompt": "branched",
        "parent": None,
        "choice": None,
        "cause": "system_changed",
    }
    assert fourth.attributes["agl.prompt_token_ids"] == chat_template_ids(tokenizer, edited)
    assert fifth.attributes["agl.chain"]["prompt"] == "branched"
    assert fifth.attributes["agl.chain"]["cause"] == "answer_changed"
    assert fifth.attributes["agl.chain"]["parent"] in (first.span_id, second.span_id, third.span_id)
    assert fifth.attributes["agl.prompt_token_ids"] == chat_template_ids(tokenizer, changed)


async def test_token_chain_off_keeps_the_rendered_path(proxy_factory, vllm_server, new_rollout, store) -> None:
    proxy = await proxy_factory(
        [model_entry(vllm_server.model, vllm_server.base_url, backend_model=vllm_server.model, agl_token_chain="off")]
    )
    ids = await new_rollout()
    client = _client(proxy, ids)
    reply = await client.chat.completions.create(model=vllm_server.model, messages=messages(), **SAMPLING)
    history = [*messages(), _echo(reply.choices[0].message), {"role": "user", "content": "And tomorrow?"}]
    await client.chat.completions.create(model=vllm_server.model, messages=history, **SAMPLING)
    await client.close()

    for span in await wait_for_spans(store, ids[0], 2):
        assert span.attributes["agl.chain"] == {
            "prompt": "rendered",
            "parent": None,
            "choice": None,
            "cause": "backend_renders",
        }


async def test_two_proxies_behind_one_store_alternate_the_calls_of_an_attempt(
    vllm_server, tmp_path: Path, tokenizer
) -> None:
    store_process, store_url = await _store_server(tmp_path / "shared.db")
    proxies, urls = [], []
    try:
        for _ in range(2):
            process, url = await _start("--backend", vllm_server.base_url, "--model", vllm_server.model,
                                        "--store-url", store_url, "--logprobs")  # fmt: skip
            proxies.append(process)
            urls.append(url)
        store = await LightningStoreClient(store_url).open()
        rollout = await store.start_rollout(input={"q": 1})
        history = messages()
        for turn in range(4):
            base_url = f"{urls[turn % 2]}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1"
            async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
                reply = await client.chat.completions.create(
                    model=vllm_server.model, messages=history, tools=tools(), **SAMPLING
                )
            message = _echo(reply.choices[0].message)
            history = [*history, message, *_observations(message, turn)]
            # The next call goes to the other proxy once this one's span is in the store.
            await wait_for_spans(store, rollout.rollout_id, turn + 1)
        spans = await wait_for_spans(store, rollout.rollout_id, 4)
        await store.close()
    finally:
        for process in proxies:
            await _stop(process)
        store_process.send_signal(signal.SIGTERM)
        await store_process.wait()
    assert spans[0].attributes["agl.chain"] == RENDERED_FIRST
    for parent, span in zip(spans, spans[1:], strict=False):
        _assert_bridged(span, parent, tokenizer)


async def test_greedy_answers_equal_vllm_s_own_chat_endpoint(proxy_factory, vllm_server) -> None:
    """The answer made from the generated ids by derender is the one vLLM's chat endpoint gives, tools and the
    `tool_choice: required` grammar included."""
    answers = {}
    for mode in ("off", "auto"):
        proxy = await proxy_factory(
            [model_entry(vllm_server.model, vllm_server.base_url, backend_model=vllm_server.model)], token_chain=mode
        )
        async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0) as client:
            for tool_choice in ("auto", "required"):
                reply = await client.chat.completions.create(
                    model=vllm_server.model,
                    messages=messages(),
                    tools=tools(),
                    tool_choice=tool_choice,
                    temperature=0,
                    max_tokens=24,
                )
                choice = reply.choices[0]
                calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]
                answers[mode, tool_choice] = (choice.model_extra["token_ids"], choice.message.content, calls,
                                              choice.finish_reason)  # fmt: skip
    assert answers["auto", "auto"] == answers["off", "auto"]
    assert answers["auto", "required"] == answers["off", "required"]


async def _generated_tokens(http: httpx.AsyncClient, vllm_server) -> float:
    return await vllm_metric(http, vllm_server, "vllm:generation_tokens_total")


async def test_a_client_that_goes_away_stops_the_generation(chain_proxy, vllm_server, new_rollout, store) -> None:
    """The call's engine request is dropped when the client leaves, and vLLM aborts the generation."""
    ids = await new_rollout()
    # As long as the model's context allows, so that the client leaves long before the answer could be done.
    max_tokens = 2000
    body = {"model": vllm_server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "ignore_eos": True}  # fmt: skip
    async with httpx.AsyncClient(timeout=30) as http, httpx.AsyncClient(timeout=30) as agent:
        before = await _generated_tokens(http, vllm_server)
        url = chain_proxy.as_resource().get_base_url(*ids) + "/chat/completions"
        call = asyncio.create_task(agent.post(url, json=body))
        # The client leaves once vLLM is generating its answer.
        while await vllm_metric(http, vllm_server, "vllm:num_requests_running") < 1 and not call.done():
            await asyncio.sleep(0.005)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        [span] = await wait_for_spans(store, ids[0], 1)
        # Once vLLM runs nothing, the count is final: aborted, or (had it not aborted) the whole answer.
        async with asyncio.timeout(120):
            while await vllm_metric(http, vllm_server, "vllm:num_requests_running") >= 1:
                await asyncio.sleep(0.05)
        generated = await _generated_tokens(http, vllm_server) - before

    assert span.attributes["agl.error"]["type"] == "client_disconnected"
    assert generated < max_tokens
