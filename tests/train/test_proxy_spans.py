"""End to end on real components: an agent calls the tiny vLLM through agl's proxy, the proxy
writes spans into a SQLite store, and the trainer's rows are built from those spans."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from agl_store.models import reward_span
from agl_train.core.aggregate import Limits, aggregate
from agl_train.core.traces import read_rollout

pytestmark = pytest.mark.slow

WIDE = Limits(max_prompt_length=512, max_response_length=512)
MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is the weather in Paris today?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.fixture
async def stack(vllm_server, tmp_path):
    """A SQLite store and a proxy in front of the tiny vLLM (logprobs on)."""
    from agl_proxy.server.proxy import LLMProxy
    from agl_store.sqlite import SQLiteStore

    store = SQLiteStore(str(tmp_path / "agl.db"))
    await store.open()
    entry = {
        "model_name": "tiny",
        "litellm_params": {"model": f"hosted_vllm/{vllm_server.model}", "api_base": vllm_server.base_url},
    }
    proxy = LLMProxy(model_list=[entry], store=store, port=0, logprobs=True)
    await proxy.start()
    try:
        yield store, proxy
    finally:
        await proxy.stop()
        await store.close()


async def spans_settled(store, rollout_id: str, count: int) -> None:
    """Wait until the proxy's exporter has written `count` LLM-call spans of the rollout."""
    for _ in range(500):
        spans = await store.query_spans(rollout_id, name="agl.llm_call")
        if len(spans) >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"only {len(spans)} of {count} spans arrived")


async def post(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(url, json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_token_in_agent_becomes_one_row_equal_to_what_vllm_returned(stack, tokenizer) -> None:
    store, proxy = stack
    rollout = await store.start_rollout(input={"question": "weather"})
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
    url = f"{proxy.url}/rollout/{rid}/attempt/{aid}/v1/completions"
    prompt: list[int] = list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False))
    returned: list[tuple[list[int], list[int]]] = []
    async with httpx.AsyncClient(timeout=120) as http:
        for turn in range(3):
            body = await post(http, url, {"model": "tiny", "prompt": prompt, "max_tokens": 8})
            choice = body["choices"][0]
            returned.append((choice.get("prompt_token_ids") or body["prompt_token_ids"], choice["token_ids"]))
            observation = f"<|im_end|>\n<|im_start|>user\nobservation {turn}<|im_end|>\n<|im_start|>assistant\n"
            prompt = prompt + choice["token_ids"] + tokenizer.encode(observation, add_special_tokens=False)
    await store.add_span(reward_span(rid, aid, 1.0))
    await spans_settled(store, rid, 3)

    trace = await read_rollout(store, rid)
    aggregation = aggregate([trace], "trajectory", WIDE)

    (row,) = aggregation.rows
    assert row.prompt_ids == returned[0][0]
    assert row.prompt_ids + row.response_ids == returned[-1][0] + returned[-1][1]
    assert [t for t, m in zip(row.response_ids, row.response_mask, strict=False) if m] == [
        t for _, ids in returned for t in ids
    ]
    assert row.logprobs is not None and len(row.logprobs) == len(row.response_ids)
    assert (row.n_calls, row.reward, aggregation.breaks) == (3, 1.0, [])


async def tool_agent(
    stack: Any, turns: int, tools: list[dict[str, Any]] | None = None
) -> tuple[str, str, list[dict[str, Any]], list[tuple[list[int], list[int]]]]:
    """A chat agent of `turns` calls through the proxy, each answered by a tool message: its
    rollout and attempt ids, its messages, and each call's (prompt ids, generated ids) as vLLM
    returned them, once the proxy has written the spans."""
    store, proxy = stack
    rollout = await store.start_rollout(input={"question": "weather"})
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
    url = f"{proxy.url}/rollout/{rid}/attempt/{aid}/v1/chat/completions"
    messages: list[dict[str, Any]] = list(MESSAGES)
    returned: list[tuple[list[int], list[int]]] = []
    async with httpx.AsyncClient(timeout=120) as http:
        for turn in range(turns):
            request = {"model": "tiny", "messages": messages, "max_tokens": 8, **({"tools": tools} if tools else {})}
            body = await post(http, url, request)
            choice = body["choices"][0]
            returned.append((body["prompt_token_ids"], choice["token_ids"]))
            messages.append({"role": "assistant", "content": choice["message"].get("content") or ""})
            messages.append({"role": "user", "content": f"tool said: sunny, turn {turn}"})
    await spans_settled(store, rid, turns)
    return rid, aid, messages, returned


async def test_a_chat_tool_agents_generated_tokens_are_trained_exactly_once(stack, tokenizer) -> None:
    store, _ = stack
    rid, _, _, returned = await tool_agent(stack, 3, TOOLS)

    trace = await read_rollout(store, rid, reward_fillna_value=-1.0)
    aggregation = aggregate([trace], "trajectory", WIDE, tokenizer=tokenizer)

    assert trace.reward == -1.0 and not trace.has_reward
    assert [(c.prompt_ids, c.response_ids) for c in trace.calls] == returned
    generated = [t for row in aggregation.rows for t, m in zip(row.response_ids, row.response_mask, strict=False) if m]
    assert generated == [t for _, ids in returned for t in ids]
    assert sum(row.n_calls for row in aggregation.rows) == 3
    assert len(aggregation.breaks) == len(aggregation.rows) - 1
    for record in aggregation.breaks:  # the template re-renders or re-tokenizes earlier turns
        assert record.kind in {"template", "retokenized", "truncation", "other"}


async def test_calls_through_the_proxy_are_stored_as_deltas_and_read_back_whole(stack, tmp_path) -> None:
    import sqlite3

    from agl_store.sqlite import SQLiteStore

    store, _ = stack
    rid, aid, messages, returned = await tool_agent(stack, 4)

    spans = await store.query_spans(rid, aid)
    assert [
        (s.attributes["agl.prompt_token_ids"], s.attributes["agl.choices"][0]["token_ids"]) for s in spans
    ] == returned
    assert [s.attributes["agl.request"]["messages"] for s in spans][-1] == messages[:-2]
    async with SQLiteStore(":memory:", deltas=False) as whole:  # what a store without deltas returns
        copy = await whole.start_rollout(input={})
        ids = {"rollout_id": copy.rollout_id, "attempt_id": copy.attempt.attempt_id}
        await whole.add_many_spans([span.model_copy(update=ids) for span in spans])
        assert [s.attributes for s in await whole.query_spans(copy.rollout_id)] == [s.attributes for s in spans]
    with sqlite3.connect(tmp_path / "agl.db") as conn:
        assert conn.execute("SELECT count(base_pk) FROM spans WHERE rollout_id = ?", (rid,)).fetchone()[0] >= 2
