"""The trainer's side of a step around the rollout engine: registering its replicas with a proxy
that starts with no backend, and pausing / draining the proxy for the weight update."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from agl_train.core.aggregate import Limits
from agl_train.runner.dispatch import RolloutDispatcher
from agl_train.runner.groups import GroupTracker
from agl_train.runner.local import LocalRunner
from agl_train.runner.proxy_control import ProxyControl, pause_for_update, publish_replicas
from agl_train.verl_glue.config import TrainSettings
from agl_train.verl_glue.step import rollout_step

from .conftest import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture
async def bare_proxy(vllm_server, tmp_path):
    """A proxy with no backend (as `agl proxy serve --config` with an empty list starts) and its store."""
    from agl_proxy.server.proxy import LLMProxy
    from agl_store.server import create_app as create_store_app
    from agl_store.sqlite import SQLiteStore

    store = await SQLiteStore(str(tmp_path / "agl.db")).open()
    # hold_s=0: a call during the pause is refused at once rather than held until the resume.
    proxy = LLMProxy(
        model_list=[], store=store, port=0, store_app=create_store_app(store, manage_store=False), hold_s=0
    )
    await proxy.start()
    control = ProxyControl(proxy.url)
    try:
        yield store, proxy, control
    finally:
        await control.aclose()
        await proxy.stop()
        await store.close()


async def test_registered_replicas_serve_the_next_rollouts_tagged_with_the_weight_version(
    bare_proxy, vllm_server, tokenizer
) -> None:
    store, proxy, control = bare_proxy
    address = vllm_server.base_url.removeprefix("http://").removesuffix("/v1")  # as verl reports it

    resources_id = await publish_replicas(
        store, control, [address], version="7", sampling_parameters={"temperature": 1.0}
    )

    assert proxy.state.registry.model_names == [vllm_server.model, "*"]  # any name an agent sends reaches it
    resources = await store.get_resources_by_id(resources_id)
    llm = resources.resources["main_llm"]
    assert (llm.model, llm.endpoint) == (vllm_server.model, proxy.base_url)

    runner = LocalRunner(
        "tests.train.agents:CoinAgent", {"QUESTION": "input.question"}, timeout_s=120, cwd=str(REPO_ROOT)
    )
    dispatcher = RolloutDispatcher(store, runner, store_url=proxy.url)
    await dispatcher.start()
    try:
        settings = TrainSettings(
            level="transition",
            limits=Limits(256, 64),
            reward_fillna_value=0.0,
            max_ppo_update_times=None,
            enable_rollout_level_advantage=True,
            per_rollout_mean=True,
            ppo_mini_batch_size=1,
            rollout_n=1,
            train_batch_size=1,
        )
        step = await rollout_step(
            store,
            GroupTracker(store, 1),
            [{"question": "hello"}],
            settings,
            rollout_timeout_s=120,
            pad_token_id=tokenizer.pad_token_id,
            rng=random.Random(0),
            resources_id=resources_id,
            proxy=control,
        )
    finally:
        await dispatcher.stop()
    assert step.metrics["rollout/n_done"] == 1 and step.data is not None
    rollout_id = step.collected.groups[0].rollout_ids[0]
    call = (await store.query_spans(rollout_id, name="agl.llm_call"))[0]
    assert call.attributes["agl.model_version"] == "7"


async def test_pausing_for_the_update_waits_for_calls_in_flight_and_refuses_new_ones(bare_proxy, vllm_server) -> None:
    store, proxy, control = bare_proxy
    await publish_replicas(store, control, [vllm_server.base_url], version="1")
    body = {"model": vllm_server.model, "prompt": "the agent", "max_tokens": 400, "ignore_eos": True}

    async with httpx.AsyncClient(timeout=300) as http:
        long_call = asyncio.create_task(http.post(proxy.base_url + "/completions", json=body))
        while proxy.state.gate.in_flight == 0 and not long_call.done():
            await asyncio.sleep(0.01)

        metrics = await pause_for_update(control, drain_timeout_s=60)

        # A completions call takes the pass-through, which cannot continue: drained, not cut (nor parked).
        assert long_call.done() and (await long_call).status_code == 200
        assert metrics == {
            "rollout/proxy_drained": 1.0,
            "rollout/proxy_in_flight_at_update": 0.0,
            "rollout/proxy_calls_cancelled_at_update": 0.0,
            "rollout/proxy_calls_parked_at_update": 0.0,
        }
        refused = await http.post(proxy.base_url + "/completions", json={**body, "max_tokens": 1})
        assert refused.status_code == 429
        await control.resume()
        assert (await http.post(proxy.base_url + "/completions", json={**body, "max_tokens": 1})).status_code == 200
