"""End to end on a real vocabulary: an OpenAI-SDK tool agent sampling at temperature 1 through agl's proxy in
front of vLLM with the token-in endpoints; the proxy bridges each follow-up's prompt (`agl.chain`), so the
attempt's three calls are one trajectory row and every sampled token is trained once.

Skipped where the proxy does not record `agl.chain` (a proxy from before the token chain)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agl_store.models import reward_span
from agl_train.core.aggregate import Limits, aggregate
from agl_train.core.traces import read_rollout
from tests.support.conversations import tools

pytestmark = pytest.mark.slow

WIDE = Limits(max_prompt_length=4096, max_response_length=4096)


@pytest.fixture
async def stack(real_vllm_server, tmp_path):
    from agl_proxy.server.proxy import LLMProxy
    from agl_store.sqlite import SQLiteStore

    store = await SQLiteStore(str(tmp_path / "agl.db")).open()
    backend = {"model": f"hosted_vllm/{real_vllm_server.model}", "api_base": real_vllm_server.base_url}
    proxy = LLMProxy(model_list=[{"model_name": "real", "litellm_params": backend}], store=store, port=0, logprobs=True)
    await proxy.start()
    try:
        yield store, proxy
    finally:
        await proxy.stop()
        await store.close()


def run_agent(base_url: str) -> None:
    """Three calls; each answer goes back as the SDK returned it, with a tool result or a new question."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    for _ in range(3):
        answer = client.chat.completions.create(
            model="real", messages=messages, tools=tools(), temperature=1.0, max_tokens=24
        )
        message = answer.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "And tomorrow?"})


async def test_a_sampling_tool_agent_is_one_row_when_the_proxy_bridges_its_prompts(stack, real_tokenizer) -> None:
    store, proxy = stack
    rollouts = []
    for _ in range(3):
        rollout = await store.start_rollout(input={"question": "weather"})
        rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
        await asyncio.to_thread(run_agent, f"{proxy.url}/rollout/{rid}/attempt/{aid}/v1")
        await store.add_span(reward_span(rid, aid, 1.0))
        rollouts.append(rid)
    for _ in range(500):  # the proxy exports spans in the background
        counts = [len(await store.query_spans(rid, name="agl.llm_call")) for rid in rollouts]
        if min(counts) >= 3:
            break
        await asyncio.sleep(0.02)
    traces = [await read_rollout(store, rid) for rid in rollouts]
    if not any(call.chain for trace in traces for call in trace.calls):
        pytest.skip("this proxy does not record agl.chain")

    aggregation = aggregate(traces, "trajectory", WIDE, real_tokenizer)

    assert aggregation.metrics["training/n_llm_calls/bridged"] == 6
    assert aggregation.metrics["training/rows_per_rollout/max"] == 1 and aggregation.breaks == []
    for trace, row in zip(traces, aggregation.rows, strict=True):
        assert row.n_calls == 3
        trained = [t for t, m in zip(row.response_ids, row.response_mask, strict=True) if m]
        assert trained == [t for call in trace.calls for t in call.response_ids]
        last = trace.calls[-1]
        assert list(row.prompt_ids) + list(row.response_ids) == list(last.prompt_ids) + list(last.response_ids)
