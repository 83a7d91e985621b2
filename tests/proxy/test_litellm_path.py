"""Deployments served through LiteLLM (any provider it knows), here forced onto a fake OpenAI backend."""

from __future__ import annotations

import openai
import orjson

from .helpers import model_entry, wait_for_spans


async def test_litellm_deployment_serves_and_records(new_rollout, proxy_factory, backend, store) -> None:
    entry = model_entry("via-litellm", backend[1], provider="openai", agl_passthrough=False)
    entry["litellm_params"].update(api_key="sk-fake", aws_secret_access_key="AWS-SECRET", temperature=0.5)
    proxy = await proxy_factory([entry])
    ids = await new_rollout()
    client = openai.AsyncOpenAI(base_url=proxy.as_resource().get_base_url(*ids), api_key="unused", max_retries=0)
    reply = await client.chat.completions.create(model="via-litellm", messages=[{"role": "user", "content": "hi"}])
    stream = await client.chat.completions.create(
        model="via-litellm", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    await client.close()
    assert reply.choices[0].message.content == text == "Hello from the fake backend."
    assert "return_token_ids" not in backend[0].requests[-1]  # not a vLLM deployment: nothing injected

    plain, streamed = await wait_for_spans(store, ids[0], 2)
    assert plain.attributes["gen_ai.system"] == "openai" and plain.attributes["agl.error"] is None
    # The span holds the request (a deployment default included), never connection settings or credentials.
    request = plain.attributes["agl.request"]
    assert request["temperature"] == 0.5 and "api_key" not in request and "api_base" not in request
    assert "AWS-SECRET" not in orjson.dumps(plain.attributes).decode()
    assert streamed.attributes["agl.response"]["choices"][0]["message"]["content"] == text
