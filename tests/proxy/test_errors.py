"""Failures the client sees in OpenAI's error format, and the spans that record them."""

from __future__ import annotations

import openai
import pytest

from agl_proxy.server.proxy import LLMProxy

from .conftest import chat_body
from .helpers import model_entry, wait_for_spans
from .test_balancing import free_port_url


async def test_unknown_model_is_404_naming_known_models(proxy: LLMProxy, http) -> None:
    response = await http.post(proxy.base_url + "/chat/completions", json=chat_body(model="gpt-9"))
    assert response.status_code == 404
    error = response.json()["error"]
    assert "gpt-9" in error["message"] and "tiny" in error["message"]
    assert error["code"] == "model_not_found"


async def test_no_backend_is_503_and_recorded(new_rollout, proxy_factory, store, http) -> None:
    ids = await new_rollout()
    proxy = await proxy_factory([])
    response = await http.post(
        proxy.as_resource(model="tiny").get_base_url(*ids) + "/chat/completions", json=chat_body()
    )
    assert response.status_code == 503
    assert "no backend" in response.json()["error"]["message"]
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.status.status_code == "ERROR" and span.attributes["agl.error"]["status_code"] == 503


async def test_refused_connection_is_502_naming_the_backend(new_rollout, proxy_factory, store, http) -> None:
    ids = await new_rollout()
    dead = free_port_url()
    proxy = await proxy_factory([model_entry("tiny", dead)])
    response = await http.post(proxy.as_resource().get_base_url(*ids) + "/chat/completions", json=chat_body())
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert dead in message and "refused" in message
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.attributes["agl.error"]["type"] == "backend_error"


async def test_timeout_is_504(new_rollout, proxy_factory, backend, store, http) -> None:
    ids = await new_rollout()
    fake, url = backend
    fake.mode = "hang"
    entry = model_entry("tiny", url)
    entry["litellm_params"]["timeout"] = 0.3
    proxy = await proxy_factory([entry])
    response = await http.post(proxy.as_resource().get_base_url(*ids) + "/chat/completions", json=chat_body())
    assert response.status_code == 504
    assert url in response.json()["error"]["message"]
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.attributes["agl.error"]["status_code"] == 504


@pytest.mark.parametrize(
    "mode, status, words", [("garbage", 502, "not an OpenAI response"), ("error500", 502, "engine died")]
)
async def test_bad_backend_answers_are_502(proxy: LLMProxy, backend, http, mode: str, status: int, words: str) -> None:
    backend[0].mode = mode
    response = await http.post(proxy.base_url + "/chat/completions", json=chat_body())
    assert response.status_code == status
    assert words in response.json()["error"]["message"]


async def test_backend_rejection_passes_through(new_rollout, proxy: LLMProxy, backend, store, http) -> None:
    ids = await new_rollout()
    backend[0].mode = "reject400"
    response = await http.post(proxy.as_resource().get_base_url(*ids) + "/chat/completions", json=chat_body())
    assert response.status_code == 400 and response.json()["error"]["message"] == "prompt too long"
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.status.status_code == "ERROR" and "prompt too long" in span.attributes["agl.error"]["message"]


async def test_stream_dropped_midway_ends_with_an_error_event(new_rollout, proxy: LLMProxy, backend, store) -> None:
    ids = await new_rollout()
    backend[0].mode = "drop"
    client = openai.AsyncOpenAI(base_url=proxy.as_resource().get_base_url(*ids), api_key="unused", max_retries=0)
    received = ""
    with pytest.raises(openai.APIError, match="dropped the stream"):
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        async for chunk in stream:
            received += chunk.choices[0].delta.content or "" if chunk.choices else ""
    await client.close()
    assert received == "Hello from"
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.status.status_code == "ERROR"
    assert span.attributes["agl.choices"][0]["token_ids"] == [100, 101]  # what was generated before the cut


async def test_bad_json_is_400(proxy: LLMProxy, http) -> None:
    response = await http.post(
        proxy.base_url + "/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]


async def test_admin_body_that_is_not_an_object_is_400(proxy: LLMProxy, http) -> None:
    response = await http.post(proxy.url + "/proxy/pause", json=["drain"])
    assert response.status_code == 400 and "must be a JSON object" in response.json()["error"]["message"]
    assert (await http.get(proxy.url + "/proxy/state")).json()["paused"] is False


async def test_key_is_required_everywhere_but_health(proxy_factory, backend, http) -> None:
    proxy = await proxy_factory([model_entry("tiny", backend[1])], key="s3cret")
    assert (await http.get(proxy.url + "/health")).status_code == 200
    missing = await http.post(proxy.base_url + "/chat/completions", json=chat_body())
    assert missing.status_code == 401 and "missing bearer key" in missing.json()["error"]["message"]
    wrong = await http.get(proxy.url + "/proxy/state", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "wrong bearer key" in wrong.json()["error"]["message"]
    client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="s3cret")
    reply = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    await client.close()
    assert reply.choices[0].message.content


async def test_client_leaving_mid_stream_stops_the_relay(new_rollout, proxy: LLMProxy, backend, store, http) -> None:
    backend[0].chunk_delay_s = 0.2
    ids = await new_rollout()
    async with http.stream(
        "POST", proxy.as_resource().get_base_url(*ids) + "/chat/completions", json=chat_body(stream=True)
    ) as response:
        async for _ in response.aiter_raw():
            break  # the agent gives up after the first bytes
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.attributes["agl.error"]["type"] == "client_disconnected"
    assert len(span.attributes["agl.choices"][0]["token_ids"]) < 6
