"""Replicas: sticky rollouts, least load, cool-down and retry, model list updates at run time."""

from __future__ import annotations

import asyncio
import socket

from agl_proxy.backends.balancing import Balancer
from agl_proxy.common.deployments import parse_deployment

from .conftest import chat_body
from .fake_backend import FakeBackend
from .helpers import model_entry, serve, wait_for_spans


def free_port_url() -> str:
    """The URL of a port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_rollouts_stick_and_new_rollouts_spread() -> None:
    a, b = (parse_deployment(model_entry("m", f"http://{h}/v1")) for h in ("a", "b"))
    balancer = Balancer()
    first = balancer.choose([a, b], "ro-1")
    second = balancer.choose([a, b], "ro-2")
    assert {first.key, second.key} == {a.key, b.key}
    assert all(balancer.choose([a, b], "ro-1") is first for _ in range(5))


def test_busy_replica_gets_no_new_rollouts_and_failed_one_cools_down() -> None:
    now = [0.0]
    a, b = (parse_deployment(model_entry("m", f"http://{h}/v1")) for h in ("a", "b"))
    balancer = Balancer(cooldown_s=10, clock=lambda: now[0])
    balancer.acquire(a)
    assert balancer.choose([a, b], "ro-new") is b
    balancer.mark_failed(b)
    assert balancer.choose([a, b], "ro-new") is a  # the sticky replica failed: move
    now[0] = 11.0
    assert balancer.is_healthy(b)


async def test_failed_replica_is_retried_on_another(new_rollout, proxy_factory, store, http) -> None:
    good = FakeBackend(name="good")
    async with serve(good.app()) as url:
        dead = free_port_url()
        proxy = await proxy_factory([model_entry("tiny", dead), model_entry("tiny", url + "/v1")])
        rollouts = [await new_rollout() for _ in range(4)]
        for ids in rollouts:
            base = proxy.as_resource().get_base_url(*ids)
            assert (await http.post(base + "/chat/completions", json=chat_body())).status_code == 200
        for ids in rollouts:
            [span] = await wait_for_spans(store, ids[0], 1)
            assert span.attributes["agl.backend"] == url + "/v1"
        assert len(good.requests) == 4


async def test_update_model_list_while_calls_stream(new_rollout, proxy_factory, store, http) -> None:
    ids = await new_rollout()
    old, new = FakeBackend(name="old", chunk_delay_s=0.05), FakeBackend(name="new")
    async with serve(old.app()) as old_url, serve(new.app()) as new_url:
        proxy = await proxy_factory([model_entry("tiny", old_url + "/v1")])
        base = proxy.as_resource().get_base_url(*ids)

        async def streamed() -> bytes:
            async with http.stream("POST", base + "/chat/completions", json=chat_body(stream=True)) as response:
                return b"".join([c async for c in response.aiter_raw()])

        streaming = asyncio.create_task(streamed())
        while not old.requests:
            await asyncio.sleep(0.01)
        admin = await http.post(
            proxy.url + "/proxy/model_list", json={"model_list": [model_entry("tiny", new_url + "/v1")]}
        )
        assert (
            admin.status_code == 200 and admin.json()["model_list"][0]["litellm_params"]["api_base"] == new_url + "/v1"
        )
        assert (await http.post(base + "/chat/completions", json=chat_body())).status_code == 200
        assert (await streaming).endswith(b"data: [DONE]\n\n")  # the call in flight finished on the old one
        spans = await wait_for_spans(store, ids[0], 2)
        assert sorted(s.attributes["agl.backend"] for s in spans) == sorted([old_url + "/v1", new_url + "/v1"])
        assert len(new.requests) == 1


async def test_bad_model_list_is_refused_and_the_old_one_kept(proxy, http) -> None:
    response = await http.post(proxy.url + "/proxy/model_list", json={"model_list": [{"model_name": "x"}]})
    assert response.status_code == 400 and "litellm_params.model" in response.json()["error"]["message"]
    assert (await http.post(proxy.base_url + "/chat/completions", json=chat_body())).status_code == 200


async def test_replica_killed_mid_run(new_rollout, proxy_factory, store, http) -> None:
    first, second = FakeBackend(name="first"), FakeBackend(name="second")
    async with serve(second.app()) as second_url:
        async with serve(first.app()) as first_url:
            proxy = await proxy_factory(
                [model_entry("tiny", first_url + "/v1"), model_entry("tiny", second_url + "/v1")]
            )
            rollouts = [await new_rollout() for _ in range(2)]
            for ids in rollouts:
                await http.post(proxy.as_resource().get_base_url(*ids) + "/chat/completions", json=chat_body())
            assert len(first.requests) == len(second.requests) == 1  # one rollout on each
        # `first` is gone; its rollout moves to `second` and keeps working.
        for _ in range(3):
            for ids in rollouts:
                response = await http.post(
                    proxy.as_resource().get_base_url(*ids) + "/chat/completions", json=chat_body()
                )
                assert response.status_code == 200
        assert len(second.requests) == 7
        state = (await http.get(proxy.url + "/metrics")).text
        assert 'agl_proxy_calls_total{model="tiny",backend="' + second_url + '/v1",status="200"} 7' in state
