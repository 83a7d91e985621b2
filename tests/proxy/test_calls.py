"""Calls through the proxy to a vLLM-shaped backend: what the client gets, what the span keeps."""

from __future__ import annotations

import openai
import orjson
import pytest

from agl_proxy.common.deployments import parse_deployment
from agl_proxy.server.proxy import LLMProxy

from .conftest import chat_body
from .fake_backend import WORDS, fake_token_ids, word_ids
from .helpers import model_entry, wait_for_spans


async def test_chat_returns_backend_body_and_records_token_ids(
    new_rollout, proxy: LLMProxy, backend, store, http
) -> None:
    ids = await new_rollout()
    fake, _ = backend
    base = proxy.as_resource().get_base_url(*ids)
    response = await http.post(base + "/chat/completions", json=chat_body())

    assert response.status_code == 200
    body = response.json()
    assert body["choices"][0]["message"]["content"] == "".join(WORDS)
    assert body["choices"][0]["token_ids"] == word_ids(WORDS)  # vLLM's extra fields reach the client
    forwarded = fake.requests[-1]
    assert forwarded["return_token_ids"] is True and forwarded["model"] == "tiny"
    assert fake.headers[-1]["x-rollout-id"] == ids[0] and fake.headers[-1]["x-attempt-id"] == ids[1]

    [span] = await wait_for_spans(store, ids[0], 1)
    attrs = span.attributes
    assert span.name == "agl.llm_call" and span.attempt_id == ids[1] and span.sequence_id == 1
    assert span.status.status_code == "OK"
    assert attrs["agl.prompt_token_ids"] == fake_token_ids("hi")
    assert attrs["agl.choices"] == [
        {"index": 0, "token_ids": word_ids(WORDS), "logprobs": None, "finish_reason": "stop"}
    ]
    assert attrs["agl.request"]["return_token_ids"] is True
    assert attrs["agl.response"] == body
    assert attrs["gen_ai.request.model"] == "tiny" and attrs["gen_ai.system"] == "vllm"
    assert attrs["gen_ai.usage.input_tokens"] == 2 and attrs["gen_ai.usage.output_tokens"] == len(WORDS)
    assert attrs["agl.backend"] == backend[1] and attrs["agl.stream"] is False
    assert attrs["agl.latency_s"] > 0 and attrs["agl.error"] is None
    # The backend serves no token-in endpoints (no vLLM --enable-scale-out): it renders the prompt itself.
    assert attrs["agl.chain"] == {"prompt": "rendered", "parent": None, "choice": None, "cause": "backend_renders"}


async def test_streamed_chat_passes_chunks_through_and_assembles_the_span(new_rollout, proxy: LLMProxy, store) -> None:
    ids = await new_rollout()
    client = openai.AsyncOpenAI(base_url=proxy.as_resource().get_base_url(*ids), api_key="unused")
    stream = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True, n=2
    )
    texts = {0: "", 1: ""}
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    await client.close()
    assert texts == {0: "".join(WORDS), 1: "".join(WORDS)}

    [span] = await wait_for_spans(store, ids[0], 1)
    attrs = span.attributes
    assert attrs["agl.stream"] is True
    assert attrs["agl.prompt_token_ids"] == fake_token_ids("hi")
    assert [c["token_ids"] for c in attrs["agl.choices"]] == [word_ids(WORDS), word_ids(WORDS)]
    assert attrs["agl.response"]["choices"][1]["message"]["content"] == "".join(WORDS)
    assert attrs["agl.response"]["object"] == "chat.completion"
    assert attrs["gen_ai.usage.output_tokens"] == 2 * len(WORDS)
    assert attrs["agl.ttft_s"] is not None and attrs["agl.ttft_s"] <= attrs["agl.latency_s"]


async def test_completion_with_token_id_prompt(new_rollout, proxy: LLMProxy, store, http) -> None:
    ids = await new_rollout()
    response = await http.post(
        proxy.url + "/v1/completions",
        json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 6},
        headers={"x-rollout-id": ids[0], "x-attempt-id": ids[1]},
    )
    assert response.status_code == 200
    assert response.json()["choices"][0]["prompt_token_ids"] == [5, 6, 7]
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.attributes["gen_ai.operation.name"] == "text_completion"
    assert span.attributes["agl.prompt_token_ids"] == [5, 6, 7]
    assert span.attributes["agl.choices"][0]["token_ids"] == word_ids(WORDS)
    assert span.attributes["agl.chain"]["cause"] == "completions_api"  # the client gave the prompt


async def test_streamed_completion_keeps_every_token_id(new_rollout, proxy: LLMProxy, store, http) -> None:
    ids = await new_rollout()
    async with http.stream(
        "POST",
        proxy.as_resource().get_base_url(*ids) + "/completions",
        json={"model": "tiny", "prompt": "abc", "stream": True},
    ) as response:
        raw = b"".join([chunk async for chunk in response.aiter_raw()])
    assert raw.endswith(b"data: [DONE]\n\n")
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.attributes["agl.prompt_token_ids"] == fake_token_ids("abc")
    assert span.attributes["agl.choices"][0]["token_ids"] == word_ids(WORDS)
    assert span.attributes["agl.response"]["choices"][0]["text"] == "".join(WORDS)


async def test_logprobs_are_requested_when_configured(new_rollout, proxy_factory, backend, store, http) -> None:
    ids = await new_rollout()
    proxy = await proxy_factory(
        [model_entry("tiny", backend[1])], logprobs=True, sampling_overrides={"temperature": 0.0}
    )
    await http.post(proxy.as_resource().get_base_url(*ids) + "/chat/completions", json=chat_body(temperature=0.9))
    fake, _ = backend
    assert fake.requests[-1]["logprobs"] is True and fake.requests[-1]["temperature"] == 0.0
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.attributes["agl.choices"][0]["logprobs"] == [-0.5] * len(WORDS)


async def test_calls_without_rollout_are_served(proxy: LLMProxy, http) -> None:
    response = await http.post(
        proxy.base_url + "/chat/completions",
        content=orjson.dumps(chat_body()),
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert response.status_code == 200
    models = (await http.get(proxy.base_url + "/models")).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


async def test_sampling_overrides_follow_the_rollout_mode(proxy_factory, backend, store, http) -> None:
    fake, url = backend
    by_mode = {"train": {"temperature": 1.0}, "val": {"temperature": 0.0, "top_p": 1.0}}
    proxy = await proxy_factory([model_entry("tiny", url)], sampling_by_mode=by_mode)
    for mode, expected in (("train", 1.0), ("val", 0.0)):
        rollout = await store.inner.start_rollout(input={}, mode=mode)
        base = proxy.as_resource().get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)
        await http.post(base + "/chat/completions", json=chat_body(temperature=0.5))
        assert fake.requests[-1]["temperature"] == expected
    await http.post(proxy.base_url + "/chat/completions", json=chat_body(temperature=0.5))
    assert fake.requests[-1]["temperature"] == 0.5  # no rollout, no mode: the client's value


async def test_rollout_header_alone_means_its_latest_attempt(
    new_rollout, proxy: LLMProxy, backend, store, http
) -> None:
    rollout_id, attempt_id = await new_rollout()
    response = await http.post(
        proxy.base_url + "/chat/completions", json=chat_body(), headers={"x-rollout-id": rollout_id}
    )
    assert response.status_code == 200
    [span] = await wait_for_spans(store, rollout_id, 1)
    assert span.attempt_id == attempt_id and span.sequence_id == 1
    assert backend[0].headers[-1]["x-attempt-id"] == attempt_id


def test_as_resource_gives_per_rollout_urls(proxy: LLMProxy) -> None:
    resource = proxy.as_resource(sampling_parameters={"temperature": 0.7})
    assert resource.model == "tiny" and resource.sampling_parameters == {"temperature": 0.7}
    assert resource.get_base_url() == proxy.url + "/v1"
    assert resource.get_base_url("ro-1", "at-1") == proxy.url + "/rollout/ro-1/attempt/at-1/v1"


def test_update_model_list_in_python(proxy: LLMProxy, backend) -> None:
    proxy.update_model_list([model_entry("tiny", backend[1]), model_entry("big", backend[1], backend_model="big-7b")])
    assert proxy.state.registry.model_names == ["tiny", "big"]
    with pytest.raises(ValueError, match=r"model_list\[0\].litellm_params.model must be a string"):
        proxy.update_model_list([{"model_name": "x", "litellm_params": {}}])
    assert proxy.state.registry.model_names == ["tiny", "big"]  # a bad list changes nothing
    assert parse_deployment(model_entry("big", backend[1], backend_model="big-7b")).model == "big-7b"


def test_advertised_url_is_what_resources_hand_out() -> None:
    proxy = LLMProxy(
        model_list=[model_entry("tiny", "http://gpu-1:8000/v1")], host="0.0.0.0", advertise_url="http://node-3:8080/"
    )
    assert proxy.as_resource().get_base_url("ro-1", "at-1") == "http://node-3:8080/rollout/ro-1/attempt/at-1/v1"
