"""The token view: a rollout's training rows exactly as the trainer builds them, token by token.

The rows come from the training core itself (`read_rollout`, then `aggregate` at the
configured level and limits), so what the page shows is what the trainer trains. Each token
gets one role, one letter on the wire:

- `p` prompt: the row's prompt;
- `g` generated and trained: `response_mask` 1;
- `i` inserted and masked: tokens added between calls (tool output, template markers), mask 0;
- `t` truncated: cut by the response limit, not in the row the trainer sees;
- `d` in a dropped row: the prompt is over the limit, so no token of the row is trained.

A dropped row's tokens are all `d`, whatever they would be otherwise: the colour says what
happens to them, and nothing in a dropped row reaches the update.

Each row also carries its response's `versions` (`Row.versions`, over the response before the
limit cut it): which weights sampled which tokens, so a response that went on across a weight
update shows where.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from agl_store.base import LightningStore

from ..core.aggregate import LEVEL_TRAJECTORY, Limits, Row, aggregate, get_aggregator
from ..core.prefix_break import Detokenizer, PrefixBreak
from ..core.traces import RolloutTrace, read_rollout

ROLE_PROMPT = "p"
ROLE_GENERATED = "g"
ROLE_INSERTED = "i"
ROLE_TRUNCATED = "t"
ROLE_DROPPED = "d"

DEFAULT_LIMITS = Limits(max_prompt_length=2048, max_response_length=8192)
"""The trainer's default `trajectory_max_prompt_length` / `trajectory_max_response_length` (agl_train/config.yaml)."""

_UNLIMITED = Limits(max_prompt_length=sys.maxsize, max_response_length=sys.maxsize)

BREAK_EXPLANATIONS = {
    "template": "the chat template re-rendered earlier turns (e.g. stripped reasoning, changed system prompt)",
    "retokenized": "the previous response came back as text and was tokenized differently",
    "truncation": "the agent shortened its history",
    "other": "the new prompt shares no usable prefix with the previous context (another conversation?)",
}


TokenDecoder = Detokenizer
"""The part of a Hugging Face tokenizer the view uses: the one the break diagnosis uses."""


@dataclass(frozen=True)
class TokenViewOptions:
    """Which rows to build: the aggregator level and its limits (the trainer's configuration)."""

    level: str = LEVEL_TRAJECTORY
    limits: Limits = DEFAULT_LIMITS
    reward_fillna_value: float = 0.0

    def __post_init__(self) -> None:
        get_aggregator(self.level)  # an unknown level fails here, listing the valid ones


def load_tokenizer(path: str) -> TokenDecoder:
    """A Hugging Face tokenizer from a local directory (never the hub)."""
    from transformers import AutoTokenizer  # heavy: only imported when a tokenizer is asked for

    tokenizer: TokenDecoder = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return tokenizer


def token_roles(row: Row, full: Row) -> str:
    """The role letters of `row`'s prompt, response and truncated tail, in order.

    `full` is the same row built without limits: its response beyond `row`'s is what the
    response limit cut.
    """
    if row.is_drop:
        return ROLE_DROPPED * (len(full.prompt_ids) + len(full.response_ids))
    roles = [ROLE_PROMPT] * len(row.prompt_ids)
    roles += [ROLE_GENERATED if mask else ROLE_INSERTED for mask in row.response_mask]
    roles += [ROLE_TRUNCATED] * (len(full.response_ids) - len(row.response_ids))
    return "".join(roles)


def decode_pieces(ids: Iterable[int], tokenizer: TokenDecoder | None) -> dict[str, str]:
    """Each distinct id's text (special tokens kept), keyed by the id as a string; empty without a tokenizer."""
    if tokenizer is None:
        return {}
    return {str(i): tokenizer.decode([i], skip_special_tokens=False) for i in sorted(set(ids))}


def _break_record(record: PrefixBreak) -> dict[str, Any]:
    return {
        **asdict(record),
        "explanation": BREAK_EXPLANATIONS.get(record.kind, record.kind),
        "describe": record.describe(),
    }


def token_view_of_trace(
    trace: RolloutTrace, options: TokenViewOptions, tokenizer: TokenDecoder | None = None
) -> dict[str, Any]:
    """The token view of one rollout trace: rows with ids and role letters, breaks, reward, metrics.

    `pieces` maps each token id (as a string) to its decoded text; it is empty without a
    tokenizer, and the page then shows the raw ids.
    """
    aggregation = aggregate([trace], options.level, options.limits, tokenizer)
    # The same rows without limits: the part of a response past the limit is what was truncated.
    full_rows, _ = get_aggregator(options.level)(trace, _UNLIMITED, tokenizer)
    breaks_by_turn = {record.turn_index: record for record in aggregation.breaks}
    rows: list[dict[str, Any]] = []
    all_ids: list[int] = []
    for row, full in zip(aggregation.rows, full_rows, strict=True):
        ids = [*full.prompt_ids, *full.response_ids]
        all_ids += ids
        record = breaks_by_turn.get(row.turn_index)
        if record is not None:
            all_ids += record.context_window + record.prompt_window
        calls = trace.calls[row.turn_index : row.turn_index + row.n_calls]
        rows.append(
            {
                "turn_index": row.turn_index,
                "n_calls": row.n_calls,
                "sequence_ids": [call.sequence_id for call in calls],
                "reward": row.reward,
                "is_drop": row.is_drop,
                "truncated": row.truncated,
                "prompt_length": len(row.prompt_ids),
                "response_length": len(row.response_ids),
                "trained_tokens": 0 if row.is_drop else sum(row.response_mask),
                "ids": ids,
                "roles": token_roles(row, full),
                "versions": [[version, n] for version, n in full.versions],
                "break": _break_record(record) if record is not None else None,
            }
        )
    return {
        "rollout_id": trace.rollout_id,
        "attempt_id": trace.attempt_id,
        "level": options.level,
        "limits": asdict(options.limits),
        "reward": trace.reward,
        "has_reward": trace.has_reward,
        "n_calls": len(trace.calls),
        "skipped": dict(trace.skipped),
        "metrics": aggregation.metrics,
        "rows": rows,
        "decoded": tokenizer is not None,
        "pieces": decode_pieces(all_ids, tokenizer),
    }


async def token_view(
    store: LightningStore, rollout_id: str, options: TokenViewOptions, tokenizer: TokenDecoder | None = None
) -> dict[str, Any]:
    """Read a rollout's latest attempt the way the trainer does and build its token view.

    The rows are built and decoded in a worker thread: a long trajectory takes CPU time that
    the store server's event loop must not wait on.
    """
    trace = await read_rollout(store, rollout_id, reward_fillna_value=options.reward_fillna_value)
    return await asyncio.to_thread(token_view_of_trace, trace, options, tokenizer)
