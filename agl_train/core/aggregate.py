"""The trace aggregator: a rollout's LLM calls → training rows (docs/training.md).

Two levels, chosen by `agentlightning.trace_aggregator.level`:

- `transition`: every call is its own row: prompt = the call's prompt ids, response = its
  generated ids (all `response_mask` 1). Limits: verl's `data.max_prompt_length` /
  `data.max_response_length`.
- `trajectory` (default): one row per root-to-leaf path of the attempt's call graph
  (`call_graph`: the proxy's `agl.chain` says which call's context a prompt continues; calls
  without it continue the previous call while its prompt starts with exactly the previous
  prompt + response ids). The tokens added in between (tool observations, the chat template's
  turn markers) join the response with `response_mask` 0 and logprob 0; generated tokens have
  mask 1, in one row only when several paths share them. Where a call starts a new root a
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
from functools import partial
from types import MappingProxyType
from typing import Any

from .call_graph import CHAIN_BRANCHED, CHAIN_RENDERED, DEFAULT_SUPERSEDED, Path, call_graph, check_superseded
from .prefix_break import Detokenizer, PrefixBreak
from .traces import LLMCall, RolloutTrace
from .versions import Segments, joined, truncated

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
    `versions` says which weights sampled each response token (`versions.Segments`: a call's
    tokens carry their versions, `LLMCall.versions`; inserted tokens None). A call that continues
    another's context keeps that call's tokens, and so their versions, in the row.

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
    versions: Segments = ()


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
        versions=truncated(row.versions, n),
    )


def transition_rows(
    trace: RolloutTrace, limits: Limits, tokenizer: Detokenizer | None = None
) -> tuple[list[Row], list[PrefixBreak]]:
    """One row per call: `(rows, [])`."""
    return [apply_limits(_unlimited_row(trace, i, call), limits) for i, call in enumerate(trace.calls)], []


class _Segment:
    """A trajectory row being built: the merged calls so far, as growing token lists (or
    `array`s, see `Row`)."""

    def __init__(self, turn_index: int, call: LLMCall, trained: bool = True) -> None:
        self.turn_index = turn_index
        self.as_array = _keeps_arrays(call)
        self.prompt_ids = _copy_ids(call.prompt_ids, self.as_array)
        self.response_ids = _copy_ids(call.response_ids, self.as_array)
        self.response_mask = _mask(int(trained), len(call.response_ids), self.as_array)
        self.logprobs: list[float] | None = list(call.logprobs) if call.logprobs is not None else None
        self.versions = call.versions
        self.n_calls = 1
        self.last_call = call

    def context_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def merge(self, call: LLMCall, trained: bool = True) -> None:
        """Append `call` (its prompt extends this context): its new prompt tokens at mask 0, its
        sampled tokens at mask 1 when `trained` (0 when another row trains them)."""
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
        self.response_mask.extend(_mask(int(trained), len(added), self.as_array))
        if self.logprobs is not None and call.logprobs is not None:
            self.logprobs += [0.0] * len(inserted)
            self.logprobs += call.logprobs
        else:
            self.logprobs = None
        self.versions = joined([*self.versions, (None, len(inserted)), *call.versions])
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
            versions=self.versions,
        )


def _path_row(trace: RolloutTrace, path: Path) -> Row:
    first, *rest = path.steps
    segment = _Segment(first.call, trace.calls[first.call], first.trained)
    for step in rest:
        segment.merge(trace.calls[step.call], step.trained)
    return segment.to_row(trace)


def trajectory_rows(
    trace: RolloutTrace,
    limits: Limits,
    tokenizer: Detokenizer | None = None,
    *,
    superseded: str = DEFAULT_SUPERSEDED,
) -> tuple[list[Row], list[PrefixBreak]]:
    """One row per root-to-leaf path of the attempt's call graph (`call_graph`); `(rows, breaks)`.

    Calls whose spans have no `agl.chain` link as before it: a call continues the previous one
    when its prompt starts with exactly the previous prompt + response, else it starts a row
    (with a `PrefixBreak` record). The choices of one call with n > 1 each start a row (without
    a break record); such a follow-up can only extend the last of them. A sampled token on
    several paths is trained (mask 1) in one row only; `superseded` (`drop` or `mask`) says what
    happens to the paths through a call a retry replaced.
    """
    graph = call_graph(trace, tokenizer, superseded)
    for record in graph.breaks:
        logger.debug("trajectory split: %s", record.describe())
    return [apply_limits(_path_row(trace, path), limits) for path in graph.paths], graph.breaks


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


CHAIN_KINDS = ("bridged", "retry", CHAIN_BRANCHED, CHAIN_RENDERED, "unchained")
"""The `training/n_llm_calls/<kind>` counts: how each call's prompt was made (`agl.chain`), `unchained` without it."""


def _count_chains(trace: RolloutTrace, counts: dict[str, int]) -> None:
    """Add the trace's calls (one per span, not per choice) to `counts` by `agl.chain` kind and cause."""
    for call in trace.calls:
        if call.choice_position:
            continue
        chain = call.chain
        kind = chain.prompt if chain is not None else "unchained"
        counts[kind] = counts.get(kind, 0) + 1
        if chain is not None and chain.cause and kind in (CHAIN_BRANCHED, CHAIN_RENDERED):
            key = f"{kind}/{chain.cause}"
            counts[key] = counts.get(key, 0) + 1


def aggregate(
    traces: Iterable[RolloutTrace],
    level: str,
    limits: Limits,
    tokenizer: Detokenizer | None = None,
    *,
    superseded: str = DEFAULT_SUPERSEDED,
) -> Aggregation:
    """Turn rollouts into training rows at `level`, with the metrics of what was dropped or cut.

    `superseded` (`agentlightning.trace_aggregator.superseded`) applies at the trajectory level:
    see `trajectory_rows`. Metrics: `training/n_sample_dropped/marked` (rows whose prompt is over
    the limit), `training/n_truncated_sample` (rows whose response was truncated), plus
    `training/n_rows`, `training/n_rollouts`, `training/n_rollouts_without_rows`,
    `training/n_rollouts_without_reward`, `training/n_prefix_breaks`,
    `training/n_llm_calls_skipped/<reason>`, `training/rows_per_rollout/{mean,max}` and
    `training/n_llm_calls/<kind>` for the `CHAIN_KINDS` (and `branched/<cause>`,
    `rendered/<cause>`: how the proxy made the prompts).
    """
    build: RowBuilder = get_aggregator(level)
    if level == LEVEL_TRAJECTORY:
        build = partial(trajectory_rows, superseded=check_superseded(superseded))
    rows: list[Row] = []
    breaks: list[PrefixBreak] = []
    n_rollouts = n_without_rows = n_without_reward = most_rows = 0
    skipped: dict[str, int] = {}
    chains = dict.fromkeys(CHAIN_KINDS, 0)
    for trace in traces:
        n_rollouts += 1
        n_without_reward += not trace.has_reward
        for reason, count in trace.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + count
        _count_chains(trace, chains)
        trace_rows, trace_breaks = build(trace, limits, tokenizer)
        n_without_rows += not trace_rows
        most_rows = max(most_rows, len(trace_rows))
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
        "training/rows_per_rollout/mean": len(rows) / n_rollouts if n_rollouts else 0.0,
        "training/rows_per_rollout/max": most_rows,
    }
    for reason, count in sorted(skipped.items()):
        metrics[f"training/n_llm_calls_skipped/{reason}"] = count
    for kind, count in chains.items():
        metrics[f"training/n_llm_calls/{kind}"] = count
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
