"""Pauses around weight updates: new calls are held until the resume, calls in flight finish
(or are cancelled when the trainer will not wait), and agents with default settings never notice."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import openai
import pytest

from agl_proxy.common.errors import PausedError
from agl_proxy.controls.pausing import PauseGate
from agl_proxy.server.proxy import LLMProxy

from .conftest import chat_body
from .helpers import metric, model_entry, wait_for_spans


async def wait_until(condition, timeout_s: float = 10.0) -> None:
    """Wait until `condition()` (a function, sync or async) is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await _value(condition()):
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def _value(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


# The weight update: four times what the OpenAI SDK's default retries would wait in all (2 retries, 0.5 s and 1 s
# apart with jitter), so an agent that got an error instead of being held would have given up.
PAUSE_S = 12.0


async def test_an_agent_with_default_settings_waits_out_a_pause(proxy: LLMProxy, backend, http) -> None:
    fake, _ = backend
    fake.mode = "hang"
    in_flight = asyncio.create_task(http.post(proxy.base_url + "/chat/completions", json=chat_body()))
    await wait_until(lambda: (len(fake.requests) == 1))
    paused = (await http.post(proxy.url + "/proxy/pause", json={"reason": "weight update"})).json()
    assert paused["paused"] is True and paused["in_flight"] == 1 and paused["held"] == 0

    # The SDK's defaults (2 retries, a few seconds apart) would give up within seconds on a 429.
    agent = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused")
    call = asyncio.create_task(
        agent.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    )

    async def held() -> bool:
        return (await http.get(proxy.url + "/proxy/state")).json()["held"] == 1

    await wait_until(held)
    drain = asyncio.create_task(http.post(proxy.url + "/proxy/pause", json={"drain": True, "timeout": 30}))
    fake.release.set()  # the call already in flight finishes during the pause
    assert (await in_flight).status_code == 200
    assert (await drain).json()["drained"] is True
    fake.mode = "ok"
    await asyncio.sleep(PAUSE_S)
    assert not call.done()
    await http.post(proxy.url + "/proxy/resume")
    reply = await call
    await agent.close()
    assert reply.choices[0].message.content == "Hello from the fake backend."
    assert len(fake.requests) == 2  # one request: no retry reached the backend

    metrics = (await http.get(proxy.url + "/metrics")).text
    assert metric(metrics, "agl_proxy_held_calls") == 0 and metric(metrics, "agl_proxy_hold_refusals_total") == 0
    assert (
        metric(metrics, "agl_proxy_hold_seconds_count") == 1 and metric(metrics, "agl_proxy_hold_seconds_sum") > PAUSE_S
    )
    assert (await http.get(proxy.url + "/proxy/state")).json()["held"] == 0


async def test_past_the_hold_bound_a_call_gets_429_with_retry_after(proxy_factory, backend, http) -> None:
    proxy = await proxy_factory([model_entry("tiny", backend[1])], hold_s=0.2)
    await http.post(proxy.url + "/proxy/pause", json={"reason": "weight update"})
    refused = await http.post(proxy.base_url + "/chat/completions", json=chat_body())
    assert refused.status_code == 429 and refused.headers["retry-after"] == "5"
    message = refused.json()["error"]["message"]
    assert "weight update" in message and "more than 0.2 s" in message
    metrics = (await http.get(proxy.url + "/metrics")).text
    assert metric(metrics, "agl_proxy_hold_refusals_total") == 1 and metric(metrics, "agl_proxy_held_calls") == 0
    await http.post(proxy.url + "/proxy/resume")
    assert (await http.post(proxy.base_url + "/chat/completions", json=chat_body())).status_code == 200


async def test_a_held_client_that_leaves_is_dropped_without_a_trace(proxy: LLMProxy, backend, http) -> None:
    await http.post(proxy.url + "/proxy/pause")
    tasks_before = len(asyncio.all_tasks())
    call = asyncio.create_task(http.post(proxy.base_url + "/chat/completions", json=chat_body()))

    async def held() -> bool:
        return (await http.get(proxy.url + "/proxy/state")).json()["held"] == 1

    await wait_until(held)
    call.cancel()  # the agent gives up: its connection closes

    async def gone() -> bool:
        metrics = (await http.get(proxy.url + "/metrics")).text
        return metric(metrics, "agl_proxy_held_calls_gone_total") == 1

    await wait_until(gone)
    state = (await http.get(proxy.url + "/proxy/state")).json()
    assert state["held"] == 0 and state["in_flight"] == 0
    await wait_until(lambda: (len(asyncio.all_tasks()) <= tasks_before))
    await http.post(proxy.url + "/proxy/resume")
    assert backend[0].requests == []  # never forwarded


async def test_a_drain_that_times_out_can_cancel_the_calls_in_flight(
    new_rollout, proxy: LLMProxy, backend, store, http
) -> None:
    fake, _ = backend
    fake.mode = "hang"
    ids = await new_rollout()
    base = proxy.as_resource().get_base_url(*ids)
    plain = asyncio.create_task(http.post(base + "/chat/completions", json=chat_body()))
    await wait_until(lambda: (len(fake.requests) == 1))

    body = {"reason": "weight update", "drain": True, "timeout": 0.2, "cancel_after_drain_timeout": True}
    paused = (await http.post(proxy.url + "/proxy/pause", json=body)).json()
    assert paused["cancelled"] == 1 and paused["drained"] is True and paused["in_flight"] == 0

    answer = await plain
    assert answer.status_code == 503 and answer.headers["retry-after"]
    assert "cancelled by the proxy for a weight update" in answer.json()["error"]["message"]
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.status.status_code == "ERROR" and "cancelled" in (span.status.description or "")
    assert span.attributes["agl.error"]["type"] == "cancelled_for_weight_update"
    metrics = (await http.get(proxy.url + "/metrics")).text
    assert metric(metrics, "agl_proxy_cancelled_calls_total") == 1 and metric(metrics, "agl_proxy_in_flight") == 0


async def test_a_cancelled_stream_ends_with_an_error_event(proxy: LLMProxy, backend, http) -> None:
    backend[0].chunk_delay_s = 5  # the stream has started when the pause comes
    stream = asyncio.create_task(_read_stream(http, proxy.base_url + "/chat/completions"))
    await wait_until(lambda: (len(backend[0].requests) == 1))
    await asyncio.sleep(0.2)
    body = {"drain": True, "timeout": 0.1, "cancel_after_drain_timeout": True}
    assert (await http.post(proxy.url + "/proxy/pause", json=body)).json()["cancelled"] == 1
    status, text = await stream
    assert status == 200 and "cancelled_for_weight_update" in text and "[DONE]" not in text


async def _read_stream(http, url: str) -> tuple[int, str]:
    async with http.stream("POST", url, json=chat_body(stream=True)) as response:
        return response.status_code, (await response.aread()).decode()


async def test_cancelling_needs_a_drain(proxy: LLMProxy, http) -> None:
    answer = await http.post(proxy.url + "/proxy/pause", json={"cancel_after_drain_timeout": True})
    assert answer.status_code == 400 and "cancel_after_drain_timeout" in answer.json()["error"]["message"]
    unknown = await http.post(proxy.url + "/proxy/pause", json={"cancel": True})
    assert unknown.status_code == 400 and "'cancel'" in unknown.json()["error"]["message"]
    assert (await http.get(proxy.url + "/proxy/state")).json()["paused"] is False


async def test_a_parked_call_counts_as_drained_is_not_cancelled_and_goes_on_at_the_resume() -> None:
    """The gate's side of a generation that continues across an update (the token chain's side:
    test_continuation_vllm.py): a call asked to stop (`handle.stop`) parks until the resume."""
    gate = PauseGate()
    went_on = asyncio.Event()

    async def call() -> None:
        handle = await gate.enter()
        assert handle is not None
        try:
            await handle.stop.wait()  # generating until the pause asks it to stop
            await handle.park()
            handle.continued(tokens_kept=5)
            went_on.set()
        finally:
            gate.exit(handle)

    task = asyncio.ensure_future(call())
    await asyncio.sleep(0)
    gate.pause("weight update", stop_generations=True)

    assert await gate.wait_drained(timeout=5) is True
    assert gate.state()["parked"] == 1 and gate.cancel_in_flight() == 0
    gate.resume()
    await task
    assert went_on.is_set() and (gate.parked, gate.in_flight) == (0, 0)
    assert (gate.continued_calls, gate.continued_tokens_kept) == (1, 5)


async def test_a_parked_call_past_the_hold_bound_is_refused() -> None:
    gate = PauseGate()
    handle = await gate.enter()
    assert handle is not None
    gate.pause("weight update", hold_s=0.05, stop_generations=True)
    with pytest.raises(PausedError, match=r"stayed paused \(weight update\) for more than 0.05 s"):
        await handle.park()
    assert gate.parked == 0
