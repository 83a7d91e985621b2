"""The trace aggregator: a rollout's LLM calls → training rows (docs/training.md).

Two levels, chosen by `agentlightning.trace_aggregator.level`:

- `transition`: every call is its own row: prompt = the call's prompt ids, response = its
  generated ids (all `response_mask` 1). Limits: verl's `data.max_prompt_length` /
  `data.max_response_length`.
- `trajectory` (default): consecutive calls merge while the next call's prompt starts with
  exactly the previous prompt + response ids. The tokens added in between (tool
  observations, the chat template's turn markers) join the response with `response_mask` 0
  and logprob 0; generated tokens have mask 1. When the prefix breaks a new row starts and a
  `PrefixBreak` record says why. Limits: `trajectory_max_prompt_length` /
  `trajectory_max_response_length`.

Either way the prompt limit marks a row (`is_drop`, dropped from the update after the
advantage is computed, so the group statistics still see it) and the response limit
truncates the row's response (the row is kept).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Iterable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from .prefix_break import Detokenizer, PrefixBreak, diagnose_break
from .traces import LLMCall, RolloutTrace

logger = logging.getLogger(__name__)

LEVEL_TRANSITION = "transition"
LEVEL_TRAJECTORY = "trajectory"

METRIC_DROPPED_MARKED = "training/n_sample_dropped/marked"
METRIC_TRUNCATED = "training/n_truncated_sample"


@dataclass(frozen=True)
class Limits:
    """Length limits of one row, in tokens. The prompt limit marks, the response limit truncates."""

    max_prompt_length: int
    max_response_length: int

    def __post_init__(self) -> None:
        if self.max_prompt_length <= 0 or self.max_response_length <= 0:
            raise ValueError(f"length limits must be positive, got {self}")


@dataclass(frozen=True)
class Row:
    """One training row of a rollout.

    `turn_index` is the index (among the rollout's trainable calls) of the first call merged
    into the row; `n_calls` how many calls it holds. `response_mask` is 1 on generated
    tokens and 0 on tokens inserted between calls; `logprobs` lines up with `response_ids`
    (0.0 on inserted tokens) or is None when any merged call lacked logprobs. `is_drop` marks
    a row whose prompt is over the limit; `truncated` a row whose response was cut.

    Token ids and mask are lists, or, when the row's first call came as `array('i')` (the
    trainer's store client), `array('i')` ids and an `array('b')` mask: same values, and
    `tensorize` copies them as memory instead of converting a Python int per id.
    """

    rollout_id: str
    uid: str
    turn_index: int
    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    response_mask: Sequence[int]
    logprobs: list[float] | None
    reward: float
    n_calls: int = 1
    is_drop: bool = False
    truncated: bool = False


@dataclass(frozen=True)
class Aggregation:
    """The rows of a set of rollouts, the prefix breaks found, and the aggregator's metrics."""

    rows: list[Row]
    breaks: list[PrefixBreak] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


def _copy_ids(ids: Sequence[int], as_array: bool) -> MutableSequence[int]:
    """A new `array('i')` (as_array) or list of `ids`; an array copies as memory."""
    if as_array:
        return ids[:] if type(ids) is array else array("i", ids)
    return ids.tolist() if type(ids) is array else list(ids)


def _mask(value: int, n: int, as_array: bool) -> MutableSequence[int]:
    """`n` times `value` (0 or 1): an `array('b')` (as_array) or a list."""
    return array("b", bytes([value]) * n) if as_array else [value] * n


def _keeps_arrays(call: LLMCall) -> bool:
    """Whether rows starting with `call` keep arrays: its prompt came as `array('i')`, and its
    response (short ones travel as lists) fits int32."""
    if type(call.prompt_ids) is not array:
        return False
    if type(call.response_ids) is array:
        return True
    try:
        array("i", call.response_ids)
    except OverflowError:
        return False
    return True


def _unlimited_row(trace: RolloutTrace, turn_index: int, call: LLMCall) -> Row:
    """One call's row: a trajectory segment that never merges."""
    return _Segment(turn_index, call).to_row(trace)


def apply_limits(row: Row, limits: Limits) -> Row:
    """Mark `row` for dropping when its prompt is over the limit; truncate its response.

    The prompt itself is left whole (tensorising keeps its last `max_prompt_length` tokens
    only for shape; the row is dropped from the update anyway).
    """
    is_drop = len(row.prompt_ids) > limits.max_prompt_length
    n = limits.max_response_length
    if len(row.response_ids) <= n:
        return replace(row, is_drop=is_drop) if is_drop else row
    return replace(
        row,
        is_drop=is_drop,
        truncated=True,
        response_ids=row.response_ids[:n],
        response_mask=row.response_mask[:n],
        logprobs=row.logprobs[:n] if row.logprobs is not None else None,
    )


def _equal(a: Sequence[int], b: Sequence[int]) -> bool:
    # Lists and arrays never compare equal to each other; a store read mixes them only for
    # arrays too short to be packed (< 8 ids), so the element-wise path stays short.
    if type(a) is type(b):
        return a == b
    return len(a) == len(b) and all(x == y for x, y in zip(a, b, strict=False))


def extends(prompt_ids: Sequence[int], previous_prompt: Sequence[int], previous_response: Sequence[int]) -> bool:
    """Whether `prompt_ids` starts with exactly `previous_prompt + previous_response`."""
    p, r = len(previous_prompt), len(previous_response)
    if len(prompt_ids) < p + r:
        return False
    # Compare from the end of the previous context first: a re-rendered prompt usually
    # differs near the last turn, so mismatches are found sooner. Arrays compare as memory.
    return _equal(prompt_ids[p : p + r], previous_response) and _equal(prompt_ids[:p], previous_prompt)


def _continues(call: LLMCall, previous: LLMCall) -> bool:
    """Whether the store says `call` extends `previous`'s whole context (a compact read's
    `LLMCall.extends`): then `extends` holds without comparing the ids."""
    return call.extends is not None and call.extends == (
        previous.span_id,
        previous.choice_position,
        len(previous.prompt_ids) + len(previous.response_ids),
    )


def transition_rows(
    trace: RolloutTrace, limits: Limits, tokenizer: Detokenizer | None = None
) -> tuple[list[Row], list[PrefixBreak]]:
    """One row per call: `(rows, [])`."""
    return [apply_limits(_unlimited_row(trace, i, call), limits) for i, call in enumerate(trace.calls)], []


class _Segment:
    """A trajectory row being built: the merged calls so far, as growing token lists (or
    `array`s, see `Row`)."""

    def __init__(self, turn_index: int, call: LLMCall) -> None:
        self.turn_index = turn_index
        self.as_array = _keeps_arrays(call)
        self.prompt_ids = _copy_ids(call.prompt_ids, self.as_array)
        self.response_ids = _copy_ids(call.response_ids, self.as_array)
        self.response_mask = _mask(1, len(call.response_ids), self.as_array)
        self.logprobs: list[float] | None = list(call.logprobs) if call.logprobs is not None else None
        self.n_calls = 1
        self.last_call = call

    def context_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def merge(self, call: LLMCall) -> None:
        inserted, added = call.prompt_ids[self.context_length() :], call.response_ids
        if self.as_array:
            try:
                inserted = inserted if type(inserted) is array else array("i", inserted)
                added = added if type(added) is array else array("i", added)
            except OverflowError:  # a short list beyond int32: the row goes on as lists
                self.as_array = False
                self.prompt_ids = list(self.prompt_ids)
                self.response_ids = list(self.response_ids)
                self.response_mask = list(self.response_mask)
        # Both sides are arrays or both lists here: extend copies arrays as memory.
        self.response_ids.extend(inserted)
        self.response_mask.extend(_mask(0, len(inserted), self.as_array))
        self.response_ids.extend(added)
        self.response_mask.extend(_mask(1, len(added), self.as_array))
        if self.logprobs is not None and call.logprobs is not None:
            self.logprobs += [0.0] * len(inserted)
            self.logprobs += call.logprobs
        else:
            self.logprobs = None
        self.n_calls += 1
        self.last_call = call

    def to_row(self, trace: RolloutTrace) -> Row:
        return Row(
            rollout_id=trace.rollout_id,
            uid=trace.uid,
            turn_index=self.turn_index,
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            response_mask=self.response_mask,
            logprobs=self.logprobs,
            reward=trace.reward,
            n_calls=self.n_calls,
        )


def trajectory_rows(
    trace: RolloutTrace, limits: Limits, tokenizer: Detokenizer | None = None
) -> tuple[list[Row], list[PrefixBreak]]:
    """Merge consecutive calls whose prompts extend the previous context; `(rows, breaks)`.

    The merge test uses the previous *call's* prompt + response (not the merged row's), which
    is the same thing while merging: a merged row's prompt + response is exactly the last
    call's prompt + response. The choices of one call with n > 1 each start a row (without a
    break record); the next call can only extend the last of them.
    """
    rows: list[Row] = []
    breaks: list[PrefixBreak] = []
    segment: _Segment | None = None
    for turn_index, call in enumerate(trace.calls):
        if segment is None:
            segment = _Segment(turn_index, call)
            continue
        previous = segment.last_call
        if _continues(call, previous) or extends(call.prompt_ids, previous.prompt_ids, previous.response_ids):
            segment.merge(call)
            continue
        if call.span_id and call.span_id == previous.span_id:
            # Another choice of the same n > 1 call: a sibling, not a broken prefix.
            rows.append(apply_limits(segment.to_row(trace), limits))
            segment = _Segment(turn_index, call)
            continue
        record = diagnose_break(
            trace.rollout_id, turn_index, previous.prompt_ids, previous.response_ids, call.prompt_ids, tokenizer
        )
        logger.debug("trajectory split: %s", record.describe())
        breaks.append(record)
        rows.append(apply_limits(segment.to_row(trace), limits))
        segment = _Segment(turn_index, call)
    if segment is not None:
        rows.append(apply_limits(segment.to_row(trace), limits))
    return rows, breaks


RowBuilder = Callable[[RolloutTrace, Limits, Detokenizer | None], tuple[list[Row], list[PrefixBreak]]]
"""The fixed signature of an aggregator level: (trace, limits, tokenizer) → (rows, breaks)."""

AGGREGATORS: Mapping[str, RowBuilder] = MappingProxyType(
    {LEVEL_TRANSITION: transition_rows, LEVEL_TRAJECTORY: trajectory_rows}
)


def get_aggregator(level: str) -> RowBuilder:
    """The row builder of `level`; an unknown level fails and lists the valid ones."""
    try:
        return AGGREGATORS[level]
    except KeyError:
        raise ValueError(f"unknown trace_aggregator level {level!r}; valid levels: {sorted(AGGREGATORS)}") from None


def aggregate(
    traces: Iterable[RolloutTrace],
    level: str,
    limits: Limits,
    tokenizer: Detokenizer | None = None,
) -> Aggregation:
    """Turn rollouts into training rows at `level`, with the metrics of what was dropped or cut.

    Metrics: `training/n_sample_dropped/marked` (rows whose prompt is over the limit),
    `training/n_truncated_sample` (rows whose response was truncated), plus
    `training/n_rows`, `training/n_rollouts`, `training/n_rollouts_without_rows`,
    `training/n_rollouts_without_reward`, `training/n_prefix_breaks` and
    `training/n_llm_calls_skipped/<reason>`.
    """
    build = get_aggregator(level)
    rows: list[Row] = []
    breaks: list[PrefixBreak] = []
    n_rollouts = n_without_rows = n_without_reward = 0
    skipped: dict[str, int] = {}
    for trace in traces:
        n_rollouts += 1
        n_without_reward += not trace.has_reward
        for reason, count in trace.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + count
        trace_rows, trace_breaks = build(trace, limits, tokenizer)
        n_without_rows += not trace_rows
        rows += trace_rows
        breaks += trace_breaks
    metrics: dict[str, float] = {
        METRIC_DROPPED_MARKED: sum(row.is_drop for row in rows),
        METRIC_TRUNCATED: sum(row.truncated for row in rows),
        "training/n_rows": len(rows),
        "training/n_rollouts": n_rollouts,
        "training/n_rollouts_without_rows": n_without_rows,
        "training/n_rollouts_without_reward": n_without_reward,
        "training/n_prefix_breaks": len(breaks),
    }
    for reason, count in sorted(skipped.items()):
        metrics[f"training/n_llm_calls_skipped/{reason}"] = count
    _warn_if_mostly_dropped(rows, level, limits)
    return Aggregation(rows=rows, breaks=breaks, metrics=metrics)


PROMPT_LIMIT_KEYS = {
    LEVEL_TRAJECTORY: "agentlightning.trace_aggregator.trajectory_max_prompt_length",
    LEVEL_TRANSITION: "data.max_prompt_length",
}
"""The setting that bounds a row's prompt, by level: what to raise when rows are dropped for length."""


def _warn_if_mostly_dropped(rows: Sequence[Row], level: str, limits: Limits) -> None:
    """A warning, naming the limit and the prompt length it would need, when most rows are over it.

    Such a step trains (almost) nothing, and a metric alone is easy to miss: a coding agent's
    first prompt (8-25k tokens of instructions and tools) is over a 2048-token limit in every row.
    """
    dropped = [len(row.prompt_ids) for row in rows if row.is_drop]
    if not rows or 2 * len(dropped) <= len(rows):
        return
    logger.warning(
        "%d of %d training rows are dropped: their prompts (up to %d tokens) are longer than %s = %d; "
        "raise it (and the response limit with it) or these rollouts train nothing",
        len(dropped),
        len(rows),
        max(dropped),
        PROMPT_LIMIT_KEYS.get(level, "the prompt limit"),
        limits.max_prompt_length,
    )


def limits_for_level(level: str, trace_aggregator: Mapping[str, Any], data: Mapping[str, Any]) -> Limits:
    """The length limits that apply at `level`.

    `trajectory` uses `agentlightning.trace_aggregator.trajectory_max_{prompt,response}_length`;
    `transition` uses verl's `data.max_{prompt,response}_length`.
    """
    get_aggregator(level)
    if level == LEVEL_TRAJECTORY:
        return Limits(
            int(trace_aggregator["trajectory_max_prompt_length"]),
            int(trace_aggregator["trajectory_max_response_length"]),
        )
    return Limits(int(data["max_prompt_length"]), int(data["max_response_length"]))
