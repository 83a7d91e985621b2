"""Spans and traces as the proxy writes them (docs/spans.md), built by hand for the tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agl_store.models import Span, reward_span
from agl_train.core.aggregate import Limits
from agl_train.core.traces import LLMCall, RolloutTrace
from agl_train.verl_glue.config import TrainSettings


def llm_call_span(
    prompt: Sequence[int],
    *responses: Sequence[int],
    sequence_id: int | None = None,
    rollout_id: str = "ro-1",
    attempt_id: str = "at-1",
    logprobs: bool = True,
    error: bool = False,
    span_id: str | None = None,
    chain: Mapping[str, Any] | None = None,
    model_version: str | None = None,
) -> Span:
    """An `agl.llm_call` span with one choice per `responses` entry (logprob −0.5 per token).

    `chain` is its `agl.chain` (how the proxy made the prompt), `model_version` its
    `agl.model_version` (the weights that served it); each absent when None."""
    choices = [
        {
            "index": i,
            "token_ids": list(r),
            "logprobs": [-0.5] * len(r) if logprobs else None,
            "finish_reason": "stop",
        }
        for i, r in enumerate(responses)
    ]
    attributes = {
        "gen_ai.operation.name": "chat",
        "agl.prompt_token_ids": list(prompt),
        "agl.choices": choices,
        "agl.error": {"type": "server_error", "message": "boom", "status_code": 500} if error else None,
    }
    if model_version is not None:
        attributes["agl.model_version"] = model_version
    if chain is not None:
        attributes["agl.chain"] = {"parent": None, "choice": None, "cause": None, **chain}
    ids = {"span_id": span_id} if span_id is not None else {}
    return Span(
        **ids,
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        name="agl.llm_call",
        status={"status_code": "ERROR" if error else "OK"},
        attributes=attributes,
    )


def reward(value: float, sequence_id: int | None = None, rollout_id: str = "ro-1", attempt_id: str = "at-1") -> Span:
    return reward_span(rollout_id, attempt_id, value, sequence_id=sequence_id)


def call(prompt: Sequence[int], response: Sequence[int], logprobs: list[float] | None = None) -> LLMCall:
    return LLMCall(prompt_ids=list(prompt), response_ids=list(response), logprobs=logprobs)


def trace(rollout_id: str, calls: Sequence[LLMCall], reward_value: float = 1.0, uid: str = "g") -> RolloutTrace:
    return RolloutTrace(rollout_id=rollout_id, uid=uid, calls=list(calls), reward=reward_value)


def train_settings(**changes) -> TrainSettings:
    """Small, valid training settings: trajectory level, 2 rollouts per prompt, 1-row mini-batches."""
    values = dict(
        level="trajectory",
        limits=Limits(8, 16),
        reward_fillna_value=0.0,
        max_ppo_update_times=None,
        enable_rollout_level_advantage=True,
        per_rollout_mean=True,
        ppo_mini_batch_size=1,
        rollout_n=2,
        train_batch_size=2,
    )
    return TrainSettings(**{**values, **changes})
