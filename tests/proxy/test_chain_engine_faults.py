"""The token chain in front of an engine that fails or leaves things out (`fake_chain_engine`), through a real
LLMProxy and SQLiteStore.

A streamed call whose answer has begun ends with an error event in its API's shape when the engine fails
afterwards (the whole answer's derender): never a second response start, never another replica, and its span
says it was a chain call and what failed. A bridged call without a client limit on an engine whose model card
has no `max_model_len` generates what the context leaves, as vLLM's chat endpoint does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from .fake_chain_engine import ANSWER_IDS, FakeChainEngine
from .helpers import model_entry, serve, wait_for_spans

GENERATE = "/inference/v1/generate"


@pytest.fixture
async def engines() -> AsyncIterator[list[tuple[FakeChainEngine, str]]]:
    """Two replicas of the fake engine: (state, OpenAI base URL)."""
    out = []
    fakes = [FakeChainEngine(), FakeChainEngine()]
    async with serve(fakes[0].app()) as first, serve(fakes[1].app()) as second:
        for fake, url in zip(fakes, (first, second), strict=True):
            out.append((fake, url + "/v1"))
        yield out


def _entries(engines: list[tuple[FakeChainEngine, str]]) -> list[dict[str, Any]]:
    return [model_entry("tiny", url) for _, url in engines]


@pytest.mark.parametrize("status", [500, 400], ids=["engine-failed", "engine-refused"])
async def test_a_stream_that_fails_after_its_first_delta_ends_with_an_error_event(
    engines, proxy_factory, new_rollout, store, status
) -> None:
    for fake, _ in engines:
        fake.whole_derender_status = status
    proxy = await proxy_factory(_entries(engines))
    ids = await new_rollout()
    async with openai.AsyncOpenAI(
        base_url=proxy.as_resource().get_base_url(*ids), api_key="-", max_retries=0
    ) as client:
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        received = []
        with pytest.raises(openai.APIError, match="derender failed"):
            async for chunk in stream:
                received.append(chunk)

    assert received and received[0].choices[0].delta.content  # the answer had begun
    # Generated once: not sent to the other replica.
    assert sum(len(fake.requests.get(GENERATE, ())) for fake, _ in engines) == 1
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.attributes["agl.chain"]["prompt"] == "rendered"
    assert "derender failed" in span.attributes["agl.error"]["message"]
    assert span.attributes["agl.error"]["type"] == ("backend_rejected" if status == 400 else "backend_error")


async def test_the_responses_and_messages_streams_end_with_their_error_events(
    engines, proxy_factory, new_rollout, store
) -> None:
    for fake, _ in engines:
        fake.whole_derender_status = 500
    proxy = await proxy_factory(_entries(engines))
    ids = await new_rollout()
    base = proxy.as_resource().get_base_url(*ids)
    async with httpx.AsyncClient(timeout=30) as http:
        responses = await http.post(f"{base}/responses", json={"model": "tiny", "input": "hi", "stream": True})
    events = [line for line in responses.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "event: response.created" and events[-1] == "event: error"
    assert responses.text.count("event: response.created") == 1

    root = base.removesuffix("/v1")
    async with anthropic.AsyncAnthropic(base_url=root, api_key="-", max_retries=0) as client:
        request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
        with pytest.raises(anthropic.APIStatusError, match="derender failed"):
            async with client.messages.stream(**request) as events_stream:
                await events_stream.get_final_message()
    spans = await wait_for_spans(store, ids[0], 2)
    assert all(span.attributes["agl.chain"]["prompt"] == "rendered" for span in spans)
    assert sum(len(fake.requests.get(GENERATE, ())) for fake, _ in engines) == 2


async def test_a_bridged_call_without_a_limit_or_known_context_is_not_capped_at_16_tokens(
    proxy_factory, new_rollout, store
) -> None:
    fake = FakeChainEngine(max_model_len=None)
    async with serve(fake.app()) as url:
        proxy = await proxy_factory([model_entry("tiny", url + "/v1")])
        ids = await new_rollout()
        base_url = proxy.as_resource().get_base_url(*ids)
        async with openai.AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0) as client:
            history: list[Any] = [{"role": "user", "content": "hi"}]
            first = await client.chat.completions.create(model="tiny", messages=history)
            history += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
            second = await client.chat.completions.create(model="tiny", messages=history)

    spans = await wait_for_spans(store, ids[0], 2)
    assert spans[1].attributes["agl.chain"]["prompt"] == "bridged"
    # As vLLM's chat endpoint: generate sizes the answer by what the context leaves after the bridged prompt.
    assert "max_tokens" not in fake.requests[GENERATE][1]["sampling_params"]
    assert second.choices[0].model_extra["token_ids"] == ANSWER_IDS
    assert second.choices[0].finish_reason == "stop"
