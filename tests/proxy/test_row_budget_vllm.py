"""The row budget against the real tiny vLLM: a conversation's later calls are capped by what their
trajectory row still holds, so the row the trainer builds fills the budget exactly and is not cut;
the call after a full row starts a new row with its bridged prompt kept whole."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from agl_train.core.aggregate import Limits, trajectory_rows
from agl_train.core.traces import trace_from_spans
from tests.support.conversations import messages

from .helpers import wait_for_spans

pytestmark = pytest.mark.vllm
CAP = 16
"""The per-call cap (the trainer's `rollout.response_length`)."""
LEFT = 5
"""What the third call's row has left: fewer tokens than its cap."""
# Greedy, so that a second conversation repeats the first; every answer runs to its cap.
GREEDY: dict[str, Any] = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


async def _conversation(proxy: Any, store: Any, model: str, calls: int) -> list[Any]:
    """A training rollout whose agent asks `calls` times, nudging after each answer; its spans."""
    rollout = await store.inner.start_rollout(input={}, mode="train")
    base_url = proxy.as_resource().get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    history = messages()
    for _ in range(calls):
        reply = await client.chat.completions.create(model=model, messages=history, max_tokens=CAP, **GREEDY)
        answer = reply.choices[0].message.model_dump(exclude_none=True)
        history = [*history, answer, {"role": "user", "content": "Go on."}]
    await client.close()
    return await wait_for_spans(store, rollout.rollout_id, calls)


async def test_later_calls_get_what_their_row_still_holds(chain_proxy, vllm_server, store, http) -> None:
    # Without a budget, a first conversation shows how long the row is before its third answer.
    first, _, third = await _conversation(chain_proxy, store, vllm_server.model, 3)
    before_third = len(third.attributes["agl.prompt_token_ids"]) - len(first.attributes["agl.prompt_token_ids"])
    budget = before_third + LEFT
    table = {"train": {"max_tokens": CAP, "row_tokens": budget}}
    assert (await http.post(chain_proxy.url + "/proxy/sampling", json={"by_mode": table})).status_code == 200

    spans = await _conversation(chain_proxy, store, vllm_server.model, 4)

    root = len(spans[0].attributes["agl.prompt_token_ids"])
    caps = []
    for span in spans[:3]:
        used = len(span.attributes["agl.prompt_token_ids"]) - root
        cap = min(CAP, budget - used)
        assert span.attributes["agl.sampling"] == {
            "temperature": 0.0,
            "max_tokens": cap,
            "row_tokens": budget,
            "row_used": used,
        }
        assert len(span.attributes["agl.choices"][0]["token_ids"]) == cap  # ignore_eos: each answer runs to it
        assert span.attributes["agl.response"]["choices"][0]["finish_reason"] == "length"
        caps.append(cap)
    assert [s.attributes["agl.chain"]["prompt"] for s in spans[:3]] == ["rendered", "bridged", "bridged"]
    assert caps == [CAP, CAP, LEFT]  # the third call is cut by its row, not by its cap
    third = spans[2]
    row_end = len(third.attributes["agl.prompt_token_ids"]) + len(third.attributes["agl.choices"][0]["token_ids"])
    assert row_end - root == budget

    # The row is full: the fourth call's bridged prompt, kept whole, starts a row of its own.
    fourth = spans[3]
    assert fourth.attributes["agl.chain"] == {
        "prompt": "branched",
        "parent": third.span_id,
        "choice": None,
        "cause": "row_full",
    }
    prompt = fourth.attributes["agl.prompt_token_ids"]
    third_context = third.attributes["agl.prompt_token_ids"] + third.attributes["agl.choices"][0]["token_ids"]
    assert prompt[:row_end] == third_context
    assert fourth.attributes["agl.sampling"]["max_tokens"] == CAP
    assert fourth.attributes["agl.sampling"]["row_used"] == 0

    # The trainer's rows: the first fills the budget exactly and is not truncated.
    trace = trace_from_spans(spans[0].rollout_id, spans)
    rows, breaks = trajectory_rows(trace, Limits(max_prompt_length=len(prompt) + 1, max_response_length=budget))
    assert [(row.n_calls, len(row.response_ids), row.truncated) for row in rows] == [
        (3, budget, False),
        (1, CAP, False),
    ]
    assert breaks == []  # a full row is no broken prefix
