"""A generation survives a weight update, against the real-vocabulary tiny vLLM, its calls paced
(`examples/tiny_vllm/pace.py`) so that the update lands mid-generation.

The trainer pauses the proxy with `stop_generations` (`agentlightning.update_in_flight:
continue`): a token-chain call still generating stops on the engine, keeps its ids and
log-probs, parks while the weights change, and continues from its prompt and those ids when the
proxy resumes, on the version served then. The client gets one answer; with greedy sampling it is
the answer vLLM's own chat endpoint gives uninterrupted (the weights here do not change); the span records which version
sampled which ids (`agl.choices[i].segments`), and `/metrics` counts the continuation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from agl_train.core.aggregate import Limits, aggregate
from agl_train.core.traces import trace_from_spans
from agl_train.runner.proxy_control import ProxyControl
from examples.tiny_vllm.pace import paced
from tests.support.conversations import messages

from .helpers import metric, model_entry, vllm_metric, wait_for_spans

pytestmark = pytest.mark.vllm
TOKENS = 200
PACE_S = 0.03
"""At least 6 s a generation: longer than the client's first token and the pause take on a loaded machine."""
GREEDY_LONG: dict[str, Any] = {"temperature": 0, "max_tokens": TOKENS, "extra_body": {"ignore_eos": True}}


def _entry(real_vllm_server: Any, version: str, **info: Any) -> dict[str, Any]:
    """The replica registered under weight `version`, its calls paced (examples/tiny_vllm/pace.py), so the
    update lands mid-generation however loaded the machine is."""
    entry = model_entry(
        real_vllm_server.model,
        real_vllm_server.base_url,
        backend_model=real_vllm_server.model,
        agl_model_version=version,
        **info,
    )
    entry["litellm_params"]["vllm_xargs"] = paced(PACE_S)
    return entry


async def _engine_running(real_vllm_server: Any, requests: int) -> None:
    """Wait until the engine generates `requests` requests (vLLM's own gauge)."""
    async with httpx.AsyncClient() as http:
        for _ in range(3000):
            if await vllm_metric(http, real_vllm_server, "vllm:num_requests_running") >= requests:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("the engine never ran the call")


async def _update_during(
    call: Awaitable[Any], started: Callable[[], Awaitable[None]], proxy: Any, real_vllm_server: Any, **info: Any
) -> tuple[Any, dict[str, Any]]:
    """Run `call`; once `started`, pause the proxy as the trainer does for a weight update (its
    replicas then serve version "2"), resume, and return the call's result and the pause's answer."""
    control = ProxyControl(proxy.url)
    task = asyncio.ensure_future(call)
    try:
        begun = asyncio.ensure_future(started())
        await asyncio.wait((task, begun), return_when=asyncio.FIRST_COMPLETED)
        if not begun.done():
            begun.cancel()
            raise AssertionError(f"the call ended before the update: {task.result()!r:.200}")
        paused = await control.pause("weight update", drain=True, timeout_s=60, stop_generations=True)
        await control.update_model_list([_entry(real_vllm_server, "2", **info)])
        await control.resume()
        return await task, paused
    finally:
        await control.aclose()


async def _greedy_ids(real_vllm_server: Any) -> list[int]:
    """The uninterrupted greedy answer's ids, from vLLM's own chat endpoint (not paced: the pace
    leaves the ids alone)."""
    engine = openai.AsyncOpenAI(base_url=real_vllm_server.base_url, api_key="-", max_retries=0)
    unpaced = {**GREEDY_LONG, "extra_body": {"ignore_eos": True, "return_token_ids": True}}
    whole = await engine.chat.completions.create(model=real_vllm_server.model, messages=messages(), **unpaced)
    await engine.close()
    return list(whole.choices[0].model_extra["token_ids"])


async def _metric(proxy: Any, name: str) -> float:
    async with httpx.AsyncClient() as http:
        return metric((await http.get(proxy.url + "/metrics")).text, name)


def _two_versions(choice: dict[str, Any]) -> int:
    """The ids the first version sampled, checking the choice has exactly two segments, "1" then "2"."""
    (first, kept), (second, rest) = choice["segments"]
    assert (first, second) == ("1", "2")
    assert 0 < kept < TOKENS and kept + rest == len(choice["token_ids"]) == TOKENS
    return int(kept)


async def test_a_streamed_call_continues_across_a_weight_update_as_one_answer(
    proxy_factory, real_vllm_server, new_rollout, store
) -> None:
    proxy = await proxy_factory([_entry(real_vllm_server, "1")], logprobs=True)
    ids = await new_rollout()
    client = openai.AsyncOpenAI(base_url=proxy.as_resource().get_base_url(*ids), api_key="-", max_retries=0)
    first_delta = asyncio.Event()

    async def stream() -> list[Any]:
        chunks = []
        answer = await client.chat.completions.create(
            model=real_vllm_server.model, messages=messages(), stream=True, **GREEDY_LONG
        )
        async for chunk in answer:
            chunks.append(chunk)
            if chunk.choices and (chunk.choices[0].model_extra or {}).get("token_ids"):
                first_delta.set()
        return chunks

    chunks, paused = await _update_during(stream(), first_delta.wait, proxy, real_vllm_server)
    await client.close()

    assert paused["parked"] == 1 and paused["drained"] is True and paused["cancelled"] == 0
    streamed = [i for c in chunks if c.choices for i in (c.choices[0].model_extra or {}).get("token_ids") or ()]
    assert streamed == await _greedy_ids(real_vllm_server)
    [end] = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert end.choices[0].finish_reason == "length"

    [span] = await wait_for_spans(store, ids[0], 1)
    [choice] = span.attributes["agl.choices"]
    kept = _two_versions(choice)
    assert len(choice["logprobs"]) == TOKENS
    assert span.attributes["agl.model_version"] == "1"  # the version the call started on
    # The trainer reads it as one response sampled by two versions.
    [row] = aggregate([trace_from_spans(ids[0], [span])], "trajectory", Limits(64, TOKENS)).rows
    assert row.versions == ((1, kept), (2, TOKENS - kept))
    assert await _metric(proxy, "agl_proxy_continued_calls_total") == 1
    assert await _metric(proxy, "agl_proxy_continued_tokens_kept_total") == kept


async def test_a_call_that_is_not_streamed_continues_each_of_its_choices(
    proxy_factory, real_vllm_server, new_rollout, store
) -> None:
    # The trainer registers its replicas so (`update_in_flight: continue`): every chain call streams from the engine.
    proxy = await proxy_factory([_entry(real_vllm_server, "1", agl_continue_generations=True)], logprobs=True)
    ids = await new_rollout()
    client = openai.AsyncOpenAI(base_url=proxy.as_resource().get_base_url(*ids), api_key="-", max_retries=0)
    # top_k 1: greedy, which vLLM refuses for n > 1 when asked as temperature 0.
    top_1 = {**GREEDY_LONG, "temperature": 1.0, "extra_body": {"ignore_eos": True, "top_k": 1}}
    call = client.chat.completions.create(model=real_vllm_server.model, messages=messages(), n=2, **top_1)

    answer, paused = await _update_during(
        call, lambda: _engine_running(real_vllm_server, 2), proxy, real_vllm_server, agl_continue_generations=True
    )
    await client.close()

    assert paused["parked"] == 1 and paused["cancelled"] == 0
    greedy = await _greedy_ids(real_vllm_server)
    assert [c.model_extra["token_ids"] for c in answer.choices] == [greedy, greedy]
    assert answer.usage.completion_tokens == 2 * TOKENS
    [span] = await wait_for_spans(store, ids[0], 1)
    for choice in span.attributes["agl.choices"]:
        _two_versions(choice)


async def test_a_messages_stream_and_a_responses_call_continue_too(
    proxy_factory, real_vllm_server, new_rollout, store
) -> None:
    proxy = await proxy_factory([_entry(real_vllm_server, "1", agl_continue_generations=True)], logprobs=True)
    messages_ids, responses_ids = await new_rollout(), await new_rollout()
    anthropic_client = anthropic.AsyncAnthropic(
        base_url=proxy.as_resource().get_base_url(*messages_ids).removesuffix("/v1"), api_key="-", max_retries=0
    )
    openai_client = openai.AsyncOpenAI(
        base_url=proxy.as_resource().get_base_url(*responses_ids), api_key="-", max_retries=0
    )

    async def messages_stream() -> str:
        async with anthropic_client.messages.stream(
            model=real_vllm_server.model,
            messages=[{"role": "user", "content": "Say something long."}],
            max_tokens=TOKENS,
            extra_body={"ignore_eos": True},
        ) as stream:
            return await stream.get_final_text()

    async def responses_call() -> str:
        response = await openai_client.responses.create(
            model=real_vllm_server.model,
            input="Say something long.",
            max_output_tokens=TOKENS,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        return response.output_text

    (streamed, text), paused = await _update_during(
        asyncio.gather(messages_stream(), responses_call()),
        lambda: _engine_running(real_vllm_server, 2),
        proxy,
        real_vllm_server,
        agl_continue_generations=True,
    )
    await anthropic_client.close()
    await openai_client.close()

    assert paused["parked"] == 2
    assert streamed and text  # each client read one whole answer
    for ids, api in ((messages_ids, "messages"), (responses_ids, "responses")):
        [span] = await wait_for_spans(store, ids[0], 1)
        assert span.attributes["agl.api"] == api
        [choice] = span.attributes["agl.choices"]
        _two_versions(choice)
