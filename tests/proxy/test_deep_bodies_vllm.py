"""A body nested deeper than a span can hold is refused with a 400 naming its field on every
route; the refused call's span keeps the body without that field, and the proxy goes on serving."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from .helpers import wait_for_spans

pytestmark = pytest.mark.vllm


DEEP = "<deep>"
JSON = {"content-type": "application/json"}


def with_deep(body: dict[str, Any], depth: int) -> bytes:
    """`body`'s JSON, `DEEP` standing for an object nested `depth` levels (deeper than Python's json writes)."""
    return orjson.dumps(body).replace(orjson.dumps(DEEP), b'{"a":' * depth + b'"leaf"' + b"}" * depth)


@pytest.mark.parametrize("depth", [200, 300, 1000])
async def test_a_deep_body_is_a_400_naming_its_field_on_every_route(
    chain_proxy, vllm_server, new_rollout, store, http, depth: int
) -> None:
    ids = await new_rollout()
    base = chain_proxy.as_resource().get_base_url(*ids)
    deep = {"role": "user", "content": "hi", "extra": DEEP}
    model = vllm_server.model
    refused = [
        ("/chat/completions", {"model": model, "messages": [deep]}),
        ("/chat/completions", {"model": model, "messages": [deep], "stream": True}),
        ("/completions", {"model": model, "prompt": "hi", "logit_bias": DEEP}),
        ("/responses", {"model": model, "input": [deep]}),
    ]
    for path, body in refused:
        response = await http.post(base + path, content=with_deep(body, depth), headers=JSON)
        assert response.status_code == 400, (path, response.text)
        field = "logit_bias" if path == "/completions" else "input" if path == "/responses" else "messages"
        assert response.json()["error"]["message"] == f"{field}: nests deeper than 128 levels", path

    answered = await http.post(
        base + "/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert answered.status_code == 200
    spans = await wait_for_spans(store, ids[0], len(refused) + 1)
    *refusals, span = sorted(spans, key=lambda s: s.sequence_id)
    for (path, body), refusal in zip(refused, refusals, strict=True):
        assert refusal.status.status_code == "ERROR"
        assert refusal.attributes["agl.error"]["type"] == "bad_request", path
        request = refusal.attributes["agl.request"]
        field = next(name for name, value in body.items() if DEEP in orjson.dumps(value).decode())
        assert request[field] == "<nests deeper than 128 levels: not kept>", path
        assert request["model"] == model
    assert span.status.status_code == "OK" and span.attributes["agl.api"] == "chat.completions"
