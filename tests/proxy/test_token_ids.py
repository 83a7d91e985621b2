"""Token ids are never missing silently: every answered call's span says whether its ids are
all there (`agl.token_ids.status`, `agl.token_ids.cause`), `/metrics` counts it per backend,
and with `require_token_ids` a call without them is answered 502 (an error event mid-stream)."""

from __future__ import annotations

import openai
import pytest

from .conftest import chat_body
from .helpers import model_entry, wait_for_spans

NO_IDS = "no prompt_token_ids in the backend's answer"
SHORT = "5 response token ids but usage.completion_tokens is 6"


async def _call(http, base: str, stream: bool, usage: bool = True) -> tuple[int, str]:
    """(status, body) of one chat call; a stream asks for `usage` so that its ids can be counted."""
    body = chat_body(stream=stream)
    if stream and usage:
        body["stream_options"] = {"include_usage": True}
    async with http.stream("POST", base + "/chat/completions", json=body) as response:
        return response.status_code, (await response.aread()).decode()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("ids", "status", "cause"),
    [("all", "ok", None), ("none", "missing", NO_IDS), ("short", "mismatch", SHORT)],
    ids=["all-ids", "no-ids", "short-ids"],
)
async def test_each_answered_call_says_whether_its_token_ids_are_there(
    new_rollout, proxy_factory, backend, store, http, stream, ids, status, cause
) -> None:
    fake, url = backend
    fake.token_ids = ids
    proxy = await proxy_factory([model_entry("tiny", url)])
    rollout_id, attempt_id = await new_rollout()
    answer_status, _ = await _call(http, proxy.as_resource().get_base_url(rollout_id, attempt_id), stream)
    assert answer_status == 200  # recorded, not refused: the proxy does not require ids by default

    [span] = await wait_for_spans(store, rollout_id, 1)
    assert span.status.status_code == "OK"
    assert span.attributes["agl.token_ids.status"] == status
    assert span.attributes.get("agl.token_ids.cause") == cause
    metrics = (await http.get(proxy.url + "/metrics")).text
    assert f'agl_proxy_token_ids_total{{backend="{url}",status="{status}"}} 1' in metrics


async def test_a_litellm_deployment_without_token_ids_is_marked_missing(
    new_rollout, proxy_factory, backend, store, http
) -> None:
    _, url = backend
    entry = model_entry("tiny", url, provider="openai", agl_passthrough=False)  # not vLLM: no ids asked
    entry["litellm_params"]["api_key"] = "sk-fake"
    proxy = await proxy_factory([entry])
    rollout_id, attempt_id = await new_rollout()
    base = proxy.as_resource().get_base_url(rollout_id, attempt_id)
    # Both in one test: LiteLLM keeps its HTTP client across calls, bound to the event loop of the first.
    assert (await _call(http, base, stream=False))[0] == 200
    assert (await _call(http, base, stream=True, usage=False))[0] == 200  # LiteLLM fails on a usage chunk

    spans = await wait_for_spans(store, rollout_id, 2)
    assert [s.attributes["agl.token_ids.status"] for s in spans] == ["missing", "missing"]
    assert {s.attributes["agl.token_ids.cause"] for s in spans} == {NO_IDS}
    metrics = (await http.get(proxy.url + "/metrics")).text
    assert f'agl_proxy_token_ids_total{{backend="{url}",status="missing"}} 2' in metrics


@pytest.mark.parametrize("ids", ["none", "short"])
async def test_required_token_ids_turn_a_call_without_them_into_a_502(
    new_rollout, proxy_factory, backend, store, http, ids
) -> None:
    fake, url = backend
    fake.token_ids = ids
    proxy = await proxy_factory([model_entry("tiny", url)], require_token_ids=True)
    rollout_id, attempt_id = await new_rollout()
    agent = openai.AsyncOpenAI(base_url=proxy.as_resource().get_base_url(rollout_id, attempt_id), api_key="x")
    agent = agent.with_options(max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        await agent.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 502
    message = refused.value.message
    assert url.removesuffix("/v1") in message and (NO_IDS if ids == "none" else SHORT) in message

    # A stream has started when its ids turn out missing: it ends with an error event instead of [DONE].
    with pytest.raises(openai.APIError, match="requires them"):
        stream = await agent.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        async for _ in stream:
            pass
    await agent.close()

    spans = await wait_for_spans(store, rollout_id, 2)
    for span in spans:
        assert span.status.status_code == "ERROR" and "without usable token ids" in (span.status.description or "")
        assert span.attributes["agl.error"]["type"] == "token_ids_missing"
        assert span.attributes["agl.token_ids.status"] == ("missing" if ids == "none" else "mismatch")


async def test_required_token_ids_pass_calls_that_have_them(new_rollout, proxy_factory, backend, store, http) -> None:
    proxy = await proxy_factory([model_entry("tiny", backend[1])], require_token_ids=True)
    base = proxy.as_resource().get_base_url(*await new_rollout())
    plain_status, _ = await _call(http, base, stream=False)
    stream_status, text = await _call(http, base, stream=True)
    assert plain_status == stream_status == 200 and text.endswith("data: [DONE]\n\n")
