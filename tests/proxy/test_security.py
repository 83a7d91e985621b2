"""What agents and web pages cannot do to the proxy, and what never leaves it: deployment
secrets stay out of spans, bodies and labels; agents' key is not the admin key; keyless
proxies refuse cross-site requests; bad admin input is a 400 that changes nothing."""

from __future__ import annotations

import asyncio
import base64
import math

import httpx
import openai
import orjson
import pytest

from agl_proxy.common.errors import BadRequestError
from agl_proxy.server.app import pause_request
from agl_proxy.server.proxy import LLMProxy

from .conftest import chat_body
from .helpers import model_entry, wait_for_spans

SECRETS = ("AWS-SECRET", "VERTEX-SECRET", "HEADER-SECRET", "sk-SECRET", "pa:ss", "pa%3Ass")


def _secret_entry(host: str) -> dict:
    return {
        "model_name": "tiny",
        "litellm_params": {
            "model": "hosted_vllm/tiny",
            "api_base": f"http://agl-user:pa%3Ass@{host}/v1",
            "aws_secret_access_key": "AWS-SECRET",
            "vertex_credentials": {"private_key": "VERTEX-SECRET"},
            "extra_headers": {"X-Api-Key": "HEADER-SECRET", "X-Team": "rl"},
            "temperature": 0.5,
        },
    }


async def test_deployment_secrets_stay_out_of_spans_bodies_labels_and_the_model_list(
    new_rollout, proxy_factory, backend, store, http
) -> None:
    fake, url = backend
    host = url.split("://")[1].removesuffix("/v1")
    proxy = await proxy_factory([_secret_entry(host)])
    ids = await new_rollout()
    reply = await http.post(proxy.as_resource().get_base_url(*ids) + "/chat/completions", json=chat_body())
    assert reply.status_code == 200
    [span] = await wait_for_spans(store, ids[0], 1)

    # The backend gets the model parameters in its body, the credentials as HTTP auth and headers.
    body, headers = fake.requests[-1], fake.headers[-1]
    assert body["temperature"] == 0.5 and "aws_secret_access_key" not in body and "extra_headers" not in body
    assert headers["authorization"] == "Basic " + base64.b64encode(b"agl-user:pa:ss").decode()
    assert (headers["x-api-key"], headers["x-team"]) == ("HEADER-SECRET", "rl")

    # Spans hold what the client sent plus what the proxy added for the model; labels name no user.
    assert span.attributes["agl.request"]["temperature"] == 0.5
    assert span.attributes["agl.backend"] == f"http://{host}/v1"
    metrics = (await http.get(proxy.url + "/metrics")).text
    model_list = (await http.get(proxy.url + "/proxy/model_list")).json()["model_list"]
    for shown in (orjson.dumps(span.attributes).decode(), metrics, orjson.dumps(model_list).decode()):
        assert not [secret for secret in SECRETS if secret in shown]
    assert "agl-user" not in metrics and "agl-user" not in orjson.dumps(span.attributes).decode()
    params = model_list[0]["litellm_params"]
    assert params["api_base"] == f"http://agl-user:***@{host}/v1" and params["aws_secret_access_key"] == "***"
    assert params["temperature"] == 0.5


async def test_a_password_and_an_api_key_together_are_refused(proxy: LLMProxy, http) -> None:
    entry = model_entry("tiny", "http://u:p@127.0.0.1:9/v1")
    entry["litellm_params"]["api_key"] = "sk-SECRET"
    answer = await http.post(proxy.url + "/proxy/model_list", json={"model_list": [entry]})
    assert answer.status_code == 400 and "only one Authorization header" in answer.json()["error"]["message"]


async def test_agents_key_cannot_reach_admin_routes_or_the_store(proxy_factory, backend, http) -> None:
    proxy = await proxy_factory([model_entry("tiny", backend[1])], key="agent-key", admin_key="admin-key")
    resource = proxy.as_resource()
    assert resource.api_key == "agent-key"
    client = openai.AsyncOpenAI(base_url=resource.endpoint, api_key=resource.api_key, max_retries=0)
    reply = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content
    assert [m.id for m in (await client.models.list()).data] == ["tiny"]
    await client.close()

    agent = {"authorization": "Bearer agent-key"}
    admin = {"authorization": "Bearer admin-key"}
    for method, path in [("GET", "/proxy/model_list"), ("POST", "/proxy/pause"), ("GET", "/metrics")]:
        refused = await http.request(method, proxy.url + path, headers=agent)
        assert refused.status_code == 401 and "admin key" in refused.json()["error"]["message"], path
    assert (await http.get(proxy.url + "/proxy/state")).status_code == 401
    assert (await http.get(proxy.url + "/proxy/state", headers=admin)).json()["paused"] is False
    # The admin key also works on the LLM routes (the trainer may call them).
    assert (await http.post(proxy.base_url + "/chat/completions", json=chat_body(), headers=admin)).status_code == 200


async def test_one_key_alone_is_both_for_compatibility(proxy_factory, backend, http) -> None:
    proxy = await proxy_factory([model_entry("tiny", backend[1])], key="k")
    answer = await http.get(proxy.url + "/proxy/state", headers={"authorization": "Bearer k"})
    assert answer.status_code == 200 and proxy.admin_key == "k"


async def test_store_routes_on_the_proxy_port_need_the_admin_key_and_answer_in_the_stores_shape(
    backend, store, http
) -> None:
    from agl_store.server import create_app as create_store_app

    store_app = create_store_app(store.inner, key="admin-key", manage_store=False)
    proxy = LLMProxy(
        [model_entry("tiny", backend[1])], store, port=0, key="agent-key", admin_key="admin-key", store_app=store_app
    )
    await proxy.start()
    try:
        path = proxy.url + "/v1/agl/rollouts"
        refused = await http.get(path, headers={"authorization": "Bearer agent-key"})
        assert (await http.get(path, headers={"authorization": "Bearer admin-key"})).status_code == 200
        missing = await http.get(path)
    finally:
        await proxy.stop()
    # What `agl store serve` answers: {"error": {"code", "message"}}, not the proxy's OpenAI shape.
    assert refused.status_code == missing.status_code == 401
    assert refused.json()["error"]["code"] == missing.json()["error"]["code"] == "unauthorized"
    assert "type" not in refused.json()["error"] and "admin key" in refused.json()["error"]["message"]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(store_app), base_url="http://127.0.0.1") as alone:
        served_alone = await alone.get("/v1/agl/rollouts")
    assert set(served_alone.json()["error"]) == set(missing.json()["error"]) == {"code", "message"}


@pytest.mark.parametrize("api_base", ["file:///etc/passwd", "gopher://127.0.0.1:70/", "ftp://h/v1", "http:///v1"])
async def test_deployments_must_use_http(proxy: LLMProxy, http, api_base: str) -> None:
    answer = await http.post(proxy.url + "/proxy/model_list", json={"model_list": [model_entry("x", api_base)]})
    assert answer.status_code == 400 and "model_list[0].litellm_params.api_base" in answer.json()["error"]["message"]
    assert proxy.state.registry.model_names == ["tiny"]


@pytest.mark.parametrize("mode", ["garbage", "internal404"])
async def test_a_backend_that_is_no_llm_is_not_echoed(proxy: LLMProxy, backend, http, mode: str) -> None:
    backend[0].mode = mode
    answer = await http.post(proxy.base_url + "/chat/completions", json=chat_body())
    message = answer.json()["error"]["message"]
    assert answer.status_code == 502 and "text/html" in message
    assert "internal-only" not in message and "oops" not in message


# --- web pages against a keyless proxy on 127.0.0.1 --------------------------------------


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/proxy/pause", {"content-type": "text/plain"}),
        ("/proxy/model_list", {"content-type": "application/x-www-form-urlencoded"}),
        ("/v1/chat/completions", {"content-type": "text/plain"}),
    ],
)
async def test_form_like_writes_are_refused(proxy: LLMProxy, http, path: str, headers: dict) -> None:
    answer = await http.post(proxy.url + path, content=orjson.dumps({"model_list": []}), headers=headers)
    assert answer.status_code == 415 and "application/json" in answer.json()["error"]["message"]
    assert (await http.get(proxy.url + "/proxy/state")).json()["paused"] is False
    assert proxy.state.registry.model_names == ["tiny"]


@pytest.mark.parametrize(
    "headers",
    [{"origin": "http://evil.example"}, {"origin": "null"}, {"host": "evil.example"}, {"host": "rebound.example:8080"}],
)
async def test_foreign_origins_and_hosts_are_refused_without_a_key(proxy: LLMProxy, http, headers: dict) -> None:
    answer = await http.post(proxy.url + "/proxy/pause", json={}, headers=headers)
    assert answer.status_code == 403 and answer.json()["error"]["code"] in ("cross_origin", "forbidden_host")
    assert (await http.get(proxy.url + "/proxy/state")).json()["paused"] is False


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]"])
async def test_loopback_names_and_own_origin_pass(proxy: LLMProxy, http, host: str) -> None:
    port = proxy.port
    headers = {"host": f"{host}:{port}", "origin": f"http://{host}:{port}"}
    assert (await http.get(proxy.url + "/proxy/state", headers=headers)).status_code == 200


async def test_a_keyed_proxy_serves_any_host_name(proxy_factory, backend, http) -> None:
    proxy = await proxy_factory([model_entry("tiny", backend[1])], key="k")
    headers = {"authorization": "Bearer k", "host": "gateway.internal", "origin": "https://dashboard.internal"}
    assert (await http.get(proxy.url + "/proxy/state", headers=headers)).status_code == 200


async def test_bearer_scheme_is_case_insensitive(proxy_factory, backend, http) -> None:
    proxy = await proxy_factory([model_entry("tiny", backend[1])], key="k")
    for scheme in ("bearer", "BEARER", "Bearer"):
        assert (await http.get(proxy.url + "/proxy/state", headers={"authorization": f"{scheme} k"})).status_code == 200
    assert (await http.get(proxy.url + "/proxy/state", headers={"authorization": "Basic k"})).status_code == 401


# --- admin input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"drain": True, "timeout": "abc"}, "timeout"),
        ({"drain": True, "timeout": -1}, "timeout"),
        ({"drain": True, "timeout": True}, "timeout"),
        ({"drain": True, "timeout": [1]}, "timeout"),
        ({"drain": "yes"}, "drain"),
        ({"reason": ["x"]}, "reason"),
        ({"drain": True, "cancel_after_drain_timeout": "yes"}, "cancel_after_drain_timeout"),
        ({"stop_generations": 1}, "stop_generations"),
    ],
)
async def test_bad_pause_is_400_and_leaves_the_proxy_serving(proxy: LLMProxy, http, body: dict, field: str) -> None:
    answer = await http.post(proxy.url + "/proxy/pause", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["message"].startswith(field)
    assert (await http.get(proxy.url + "/proxy/state")).json()["paused"] is False


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf])
def test_pause_timeouts_must_be_finite(timeout: float) -> None:
    with pytest.raises(BadRequestError, match="timeout must be a finite number"):
        pause_request({"drain": True, "timeout": timeout})


def _params(**params: object) -> dict:
    return {"model_name": "x", "litellm_params": {"model": "hosted_vllm/x", **params}}


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        (1, "model_list[0] must be a mapping"),
        ({**_params(), "model_info": "x"}, "model_list[0].model_info"),
        (
            {**_params(), "model_info": {"agl_continue_generations": "yes"}},
            "model_list[0].model_info.agl_continue_generations must be true or false",
        ),
        (_params(timeout=[1]), "model_list[0].litellm_params.timeout"),
        (_params(timeout=-1), "model_list[0].litellm_params.timeout"),
        (_params(timeout=True), "model_list[0].litellm_params.timeout"),
        (_params(api_key=["k"]), "model_list[0].litellm_params.api_key"),
        (model_entry("x", "http://127.0.0.1:9/v1\r\nX-Injected: 1"), "model_list[0].litellm_params.api_base"),
        (_params(extra_headers={"a\nb": "c"}), "model_list[0].litellm_params.extra_headers"),
    ],
)
async def test_bad_model_list_is_400_naming_the_field_and_changes_nothing(
    proxy: LLMProxy, http, entry: object, field: str
) -> None:
    answer = await http.post(proxy.url + "/proxy/model_list", json={"model_list": [entry]})
    assert answer.status_code == 400 and field in answer.json()["error"]["message"], answer.text
    assert proxy.state.registry.model_names == ["tiny"]


@pytest.mark.parametrize("timeout", [math.nan, math.inf])
def test_model_list_timeouts_must_be_finite(proxy: LLMProxy, timeout: float) -> None:
    with pytest.raises(ValueError, match=r"model_list\[0\].litellm_params.timeout"):
        proxy.update_model_list([_params(api_base="http://127.0.0.1:9/v1", timeout=timeout)])
    assert proxy.state.registry.model_names == ["tiny"]


@pytest.mark.parametrize(
    ("path_ids", "headers"),
    [
        ("/rollout/r%C3%B6%E2%82%AC/attempt/a", {}),  # non-Latin-1 in the path
        ("/rollout/r%00/attempt/a", {}),
        ("/rollout/r%0D%0Ax/attempt/a", {}),
        ("/rollout/r/attempt/a%0A", {}),
        ("", {"x-rollout-id": "rö€".encode()}),  # UTF-8 bytes in the header
    ],
)
async def test_unusable_rollout_ids_are_400(proxy: LLMProxy, backend, http, path_ids: str, headers: dict) -> None:
    answer = await http.post(proxy.url + path_ids + "/v1/chat/completions", json=chat_body(), headers=headers)
    message = answer.json()["error"]["message"]
    assert answer.status_code == 400 and any(name in message for name in ("rollout id", "attempt id", "x-rollout-id"))
    assert backend[0].requests == []


async def test_a_nul_in_the_rollout_header_is_400(proxy: LLMProxy, backend) -> None:
    # No HTTP client sends a NUL in a header; a raw socket can.
    body = orjson.dumps(chat_body())
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"x-rollout-id: r\x00x\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    ) + body
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(request)
    status_line = await reader.readline()
    writer.close()
    assert status_line.split()[1] == b"400"  # from the proxy, or from the HTTP parser before it
    assert backend[0].requests == []


# --- small things -------------------------------------------------------------------------


async def test_json_answers_are_not_sniffed(proxy: LLMProxy, http) -> None:
    for answer in (
        await http.get(proxy.url + "/proxy/state"),
        await http.get(proxy.url + "/v1/models"),
        await http.post(proxy.base_url + "/chat/completions", json=chat_body(model="nope")),
    ):
        assert answer.headers["x-content-type-options"] == "nosniff"


async def test_unknown_model_names_only_a_few_known_ones(proxy: LLMProxy, backend, http) -> None:
    proxy.update_model_list([model_entry(f"model-{i:03d}", backend[1]) for i in range(50)])
    answer = await http.post(proxy.base_url + "/chat/completions", json=chat_body(model="nope"))
    message = answer.json()["error"]["message"]
    assert answer.status_code == 404 and "model-009" in message and "model-010" not in message
    assert "and 40 more" in message


async def test_a_long_pause_reason_is_cut_before_every_429(proxy_factory, backend, http) -> None:
    proxy = await proxy_factory([model_entry("tiny", backend[1])], hold_s=0)
    await http.post(proxy.url + "/proxy/pause", json={"reason": "x" * 1_000_000})
    refused = await http.post(proxy.base_url + "/chat/completions", json=chat_body())
    assert refused.status_code == 429 and len(refused.content) < 1000
    assert len((await http.get(proxy.url + "/proxy/state")).json()["reason"]) <= 200
