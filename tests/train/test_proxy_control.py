"""The trainer's remote control of a real proxy: pause / drain / state / resume, model list."""

from __future__ import annotations

import httpx
import pytest

from agl_proxy.server.proxy import LLMProxy
from agl_train.runner.proxy_control import ProxyControl, ProxyControlError, vllm_model_list


@pytest.fixture
async def proxy():
    # hold_s=0: a call during the pause is refused at once rather than held until the resume.
    proxy = LLMProxy(model_list=[], port=0, key="sekret", hold_s=0)
    await proxy.start()
    yield proxy
    await proxy.stop()


async def test_pause_state_resume(proxy) -> None:
    control = ProxyControl(proxy.url, key="sekret")
    try:
        paused = await control.pause("weight update", drain=True, timeout_s=5)
        assert paused["paused"] and paused["drained"] and paused["in_flight"] == 0
        assert (await control.state())["reason"] == "weight update"
        async with httpx.AsyncClient() as http:
            refused = await http.post(
                proxy.url + "/v1/chat/completions",
                json={"model": "m", "messages": []},
                headers={"authorization": "Bearer sekret"},
            )
        assert refused.status_code == 429 and refused.headers["retry-after"]
        assert (await control.resume())["paused"] is False
        assert await control.wait_spans_exported(timeout_s=1)
    finally:
        await control.aclose()


async def test_replicas_are_registered_under_one_model_name(proxy) -> None:
    control = ProxyControl(proxy.url + "/v1", key="sekret")  # a base URL with /v1 works too
    try:
        entries = vllm_model_list(["10.0.0.1:8000", "http://10.0.0.2:8000/v1"], "/models/qwen", version="3")
        served = await control.update_model_list(entries)
        assert [e["litellm_params"]["api_base"] for e in served] == [
            "http://10.0.0.1:8000/v1",
            "http://10.0.0.2:8000/v1",
        ]
        assert proxy.state.registry.model_names == ["/models/qwen"]
        assert served[0]["model_info"] == {"agl_model_version": "3"}
    finally:
        await control.aclose()


async def test_the_client_is_lazy_and_errors_name_the_route(proxy) -> None:
    control = ProxyControl(proxy.url, key="wrong")
    assert control._http is None  # built on first use
    with pytest.raises(ProxyControlError, match="/proxy/state answered 401"):
        await control.state()
    await control.aclose()
    unreachable = ProxyControl("http://127.0.0.1:9", timeout_s=2)
    with pytest.raises(ProxyControlError, match="failed"):
        await unreachable.resume()
    await unreachable.aclose()


async def test_the_trainer_steers_with_the_admin_key_and_agents_get_their_own() -> None:
    from agl_train.runner.runner_settings import RunnerSettings

    proxy = LLMProxy(model_list=[], port=0, key="agent-key", admin_key="admin-key")
    await proxy.start()
    settings = RunnerSettings(agl_base_url=proxy.url, agl_key="admin-key", agl_agent_key="agent-key")
    trainer_side = ProxyControl(settings.agl_base_url, settings.agl_key)
    agent_side = ProxyControl(settings.agl_base_url, settings.agent_key)
    try:
        assert (await trainer_side.pause("weight update", drain=True, timeout_s=5))["paused"]
        assert (await trainer_side.resume())["paused"] is False
        with pytest.raises(ProxyControlError, match="/proxy/model_list answered 401"):
            await agent_side.update_model_list(vllm_model_list(["127.0.0.1:9"], "evil"))
        assert proxy.state.registry.model_names == []
    finally:
        await trainer_side.aclose()
        await agent_side.aclose()
        await proxy.stop()
    # A proxy with one key: agents get that key, as before.
    assert RunnerSettings(agl_key="k").agent_key == "k"
