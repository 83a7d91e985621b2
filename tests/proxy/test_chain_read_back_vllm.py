"""A proxy that remembers none of an attempt's calls reads them back from the store: another
proxy of a fleet, or one restarted. A Responses or Messages span keeps the client's request,
which lacks the deployment's request defaults the call was rendered with; read back, they
are put under it again, so the follow-up is bridged as it would be from memory."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from .helpers import model_entry, wait_for_spans

pytestmark = pytest.mark.vllm
DEFAULTS = {"chat_template_kwargs": {"enable_thinking": False}, "temperature": 1.0}
QUESTION = {"role": "user", "content": "Weather in Paris?"}
AGAIN = {"role": "user", "content": "And tomorrow?"}


@pytest.fixture
async def fleet(proxy_factory, vllm_server) -> list[Any]:
    """Two proxies behind one store, serving a deployment with template defaults."""
    entry = model_entry(vllm_server.model, vllm_server.base_url, backend_model=vllm_server.model)
    entry["litellm_params"].update(DEFAULTS)
    return [await proxy_factory([entry], logprobs=True) for _ in range(2)]


def _bridged_from(spans: Any) -> None:
    first, second = spans
    assert second.attributes["agl.chain"] == {"prompt": "bridged", "parent": first.span_id, "choice": 0, "cause": None}


async def test_a_responses_follow_up_served_by_another_proxy_is_bridged(fleet, vllm_server, new_rollout, store) -> None:
    ids = await new_rollout()
    first, second = (openai.AsyncOpenAI(base_url=p.as_resource().get_base_url(*ids), api_key="-") for p in fleet)
    request: dict[str, Any] = {"model": vllm_server.model, "max_output_tokens": 8}
    async with first, second:
        answer = await first.responses.create(**request, input=[QUESTION])
        await wait_for_spans(store, ids[0], 1)
        output = [item.model_dump(exclude_none=True) for item in answer.output]
        await second.responses.create(**request, input=[QUESTION, *output, AGAIN])

    _bridged_from(await wait_for_spans(store, ids[0], 2))


async def test_a_messages_follow_up_served_by_another_proxy_is_bridged(fleet, vllm_server, new_rollout, store) -> None:
    ids = await new_rollout()
    roots = [p.as_resource().get_base_url(*ids).removesuffix("/v1") for p in fleet]
    first, second = (anthropic.AsyncAnthropic(base_url=root, api_key="-") for root in roots)
    request: dict[str, Any] = {"model": vllm_server.model, "max_tokens": 8, "system": "Be brief."}
    async with first, second:
        answer = await first.messages.create(**request, messages=[QUESTION])
        await wait_for_spans(store, ids[0], 1)
        blocks = [block.model_dump(exclude_none=True) for block in answer.content]
        await second.messages.create(**request, messages=[QUESTION, {"role": "assistant", "content": blocks}, AGAIN])

    _bridged_from(await wait_for_spans(store, ids[0], 2))
