"""The trainer's pause and the proxy's bounds agree: the pause request waits as long as the drain
it asks for (plus the cancel grace), and calls held during the trainer's pause wait as long as
the pause says, not the proxy's shorter default."""

from __future__ import annotations

import asyncio

from agl_proxy.server.proxy import LLMProxy
from agl_train.runner.proxy_control import ProxyControl, pause_for_update

from .conftest import chat_body
from .helpers import model_entry
from .test_pausing import wait_until


async def test_a_drain_longer_than_the_request_timeout_still_answers(proxy_factory, backend, http) -> None:
    fake, url = backend
    proxy: LLMProxy = await proxy_factory([model_entry("tiny", url)])
    fake.mode = "hang"
    stuck = asyncio.create_task(http.post(proxy.base_url + "/chat/completions", json=chat_body()))
    await wait_until(lambda: len(fake.requests) == 1)
    # A client timeout shorter than the drain bound: the pause's own timeout must follow from the bound.
    control = ProxyControl(proxy.url, timeout_s=0.5)
    try:
        metrics = await pause_for_update(control, drain_timeout_s=1.0)
        assert metrics["rollout/proxy_calls_cancelled_at_update"] == 1.0
        assert (await stuck).status_code == 503
    finally:
        await control.resume()
        await control.aclose()


async def test_calls_held_by_a_pause_wait_as_long_as_the_pause_says(proxy_factory, backend, http) -> None:
    _, url = backend
    proxy: LLMProxy = await proxy_factory([model_entry("tiny", url)], hold_s=0.0)  # its own pauses refuse at once
    control = ProxyControl(proxy.url)
    try:
        await control.pause("weight update", hold_s=60.0)
        call = asyncio.create_task(http.post(proxy.base_url + "/chat/completions", json=chat_body()))
        await wait_until(lambda: proxy_state_held(http, proxy))
        await asyncio.sleep(0.2)  # past the proxy's own hold bound of 0 s
        await control.resume()
        assert (await call).status_code == 200
    finally:
        await control.aclose()


async def proxy_state_held(http, proxy: LLMProxy) -> bool:
    return (await http.get(proxy.url + "/proxy/state")).json()["held"] == 1


async def test_a_bad_hold_or_grace_is_refused_naming_it(proxy, http) -> None:
    for body, field in (({"hold": -1}, "hold"), ({"cancel_grace": "x", "drain": True}, "cancel_grace")):
        refused = await http.post(proxy.url + "/proxy/pause", json=body)
        assert refused.status_code == 400 and field in refused.text
