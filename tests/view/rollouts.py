"""Rollouts with known spans, written into a real store, for the view's tests.

`write_known_rollout` writes the three-call rollout the token view is checked against:

- call 1: system + user prompt, a generated answer;
- call 2: extends call 1 exactly (a tool observation in between): it merges into row 1,
  the observation's tokens inserted with mask 0;
- call 3: the system prompt was re-rendered, so the prefix breaks and row 2 begins.

With `KNOWN_LIMITS` row 1's response is truncated and row 2's (longer) prompt is over the
prompt limit, so the row is dropped: every colour of the token view appears.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agl_store.base import LightningStore
from agl_store.models import ProxyLLM, Span, reward_span
from agl_train.core.aggregate import Limits
from agl_train.runner.proxy_control import LLM_RESOURCE_NAME

Encode = Callable[[str], list[int]]

CALLS = [{"prompt": [1, 2, 3], "response": [4, 5]}, {"prompt": [1, 2, 3, 4, 5, 6], "response": [7, 8, 9]}]
"""Two calls merged into one trajectory row: 2 + 3 generated tokens trained, 1 inserted."""

INJECTION = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
"""Agent output that would run if the page ever parsed data as HTML."""

SYSTEM = "<|im_start|>system\nYou are a weather bot.<|im_end|>\n"
SYSTEM_RERENDERED = "<|im_start|>system\nYou are a weather bot. Today is Monday, be brief and polite.<|im_end|>\n"
USER = "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
ANSWER_1 = "Let me call get_weather(Paris).<|im_end|>"
OBSERVATION = "\n<|im_start|>user\ntool: sunny, 21C<|im_end|>\n<|im_start|>assistant\n"
ANSWER_2 = "It is sunny and 21 degrees in Paris today.<|im_end|>"
ANSWER_3 = "Sunny, 21C.<|im_end|>"


@dataclass(frozen=True)
class KnownRollout:
    rollout_id: str
    attempt_id: str
    calls: list[dict[str, list[int]]]
    """Per call: `prompt` and `response` token ids, as recorded in its span."""


def known_calls(encode: Encode) -> list[dict[str, list[int]]]:
    """The token ids of the three calls (see the module docstring)."""
    prompt_1 = encode(SYSTEM + USER)
    response_1 = encode(ANSWER_1)
    prompt_2 = prompt_1 + response_1 + encode(OBSERVATION)
    response_2 = encode(ANSWER_2)
    prompt_3 = encode(SYSTEM_RERENDERED + USER) + response_1 + encode(OBSERVATION) + response_2 + encode(OBSERVATION)
    response_3 = encode(ANSWER_3)
    return [
        {"prompt": prompt_1, "response": response_1},
        {"prompt": prompt_2, "response": response_2},
        {"prompt": prompt_3, "response": response_3},
    ]


def known_limits(calls: list[dict[str, list[int]]]) -> Limits:
    """Row 2's prompt (call 3's) is over the limit, row 1's is not; row 1's response loses 4 tokens."""
    row_1_response = len(calls[1]["prompt"]) - len(calls[0]["prompt"]) + len(calls[1]["response"])
    return Limits(max_prompt_length=len(calls[2]["prompt"]) - 1, max_response_length=row_1_response - 4)


def llm_call_span(
    rollout_id: str,
    attempt_id: str,
    prompt: list[int],
    response: list[int],
    start: float,
    content: str = "ok",
    version: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Span:
    """An `agl.llm_call` span shaped as the proxy writes it (docs/spans.md), served by weights
    `version`, with `extra` attributes on top."""
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name="agl.llm_call",
        start_time=start,
        end_time=start + 0.25,
        status={"status_code": "OK"},
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "vllm",
            "gen_ai.request.model": "tiny",
            "gen_ai.response.model": "tiny",
            "gen_ai.usage.input_tokens": len(prompt),
            "gen_ai.usage.output_tokens": len(response),
            "agl.request": {"model": "tiny", "messages": [{"role": "user", "content": content}]},
            "agl.response": {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]},
            "agl.prompt_token_ids": prompt,
            "agl.choices": [{"index": 0, "token_ids": response, "logprobs": None, "finish_reason": "stop"}],
            "agl.stream": False,
            "agl.backend": "http://127.0.0.1:9/v1",
            "agl.model_version": version,
            "agl.latency_s": 0.25,
            "agl.ttft_s": 0.25,
            "agl.error": None,
            **(extra or {}),
        },
    )


async def write_rollout(
    store: LightningStore,
    calls: list[dict[str, list[int]]],
    *,
    reward: float | None = 1.0,
    content: str = "ok",
    input: Any = None,
    mode: str | None = "train",
    finish: bool | str = True,
    version: str | None = None,
    extra: dict[str, Any] | None = None,
) -> KnownRollout:
    """Start a rollout (under the latest resources), write one span per call served by weights
    `version` (and a reward), and mark it succeeded, or `finish` it with that attempt status."""
    rollout = await store.start_rollout(input=input if input is not None else {"question": "weather"}, mode=mode)  # type: ignore[arg-type]
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
    start = time.time()
    spans = [
        llm_call_span(rid, aid, call["prompt"], call["response"], start + k, content, version, extra)
        for k, call in enumerate(calls)
    ]
    if reward is not None:
        spans.append(reward_span(rid, aid, reward, start_time=start + len(calls), end_time=start + len(calls)))
    for span in spans:  # one at a time: each takes the next sequence number
        await store.add_span(span)
    if finish:
        await store.update_attempt(rid, aid, status="succeeded" if finish is True else finish)  # type: ignore[arg-type]
    return KnownRollout(rid, aid, calls)


async def write_known_rollout(store: LightningStore, encode: Encode, **kwargs: Any) -> KnownRollout:
    """The three-call rollout of the module docstring, with reward 0.75."""
    return await write_rollout(store, known_calls(encode), reward=0.75, **kwargs)


async def publish(store: LightningStore, model: str = "tiny", endpoint: str = "http://127.0.0.1:9/v1") -> str:
    """A resource set as the trainer publishes one per step (`publish_replicas`)."""
    update = await store.add_resources({LLM_RESOURCE_NAME: ProxyLLM(endpoint=endpoint, model=model)})
    return update.resources_id


async def write_two_steps(store: LightningStore) -> None:
    """Step 1: three train rollouts (rewards 0, 0.5, 1), one failed, one timed out; a validation
    set of version 1 with two rollouts (0.5, 0.9). Step 2: one train rollout still running."""
    await publish(store)
    for reward in (0.0, 0.5, 1.0):
        await write_rollout(store, CALLS, reward=reward, version="1")
    await write_rollout(store, CALLS[:1], reward=None, version="1", finish="failed")
    await write_rollout(store, CALLS[:1], reward=None, version="1", finish="timeout")
    await publish(store)
    for reward in (0.5, 0.9):
        await write_rollout(store, CALLS, reward=reward, version="1", mode="val")
    await publish(store)
    await write_rollout(store, CALLS, reward=None, version="2", finish=False)
