"""What the demo prints for one rollout: its calls as the trainer reads them, and the rows it trains.

Everything here is read the way the trainer reads it, through the training core: `read_rollout`
turns the rollout's spans into calls (with `agl.chain`, how the proxy made each prompt), and
`aggregate` at the trajectory level, with the limits of agl_train/config.yaml, turns them into
rows. So the row printed is the row the trainer would train, not a re-telling of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

import yaml

from agl_train.core.aggregate import LEVEL_TRAJECTORY, Aggregation, Limits, Row, aggregate, limits_for_level
from agl_train.core.traces import LLMCall, RolloutTrace

Decode = Callable[[Sequence[int]], str]
"""Token ids to text (special tokens kept); the demo's is the model's own tokenizer."""

MAX_TEXT = 110  # characters of a run of tokens shown, on one line
HEAD_TEXT = 30  # of a longer run, its start and its end (where the tool result and the next turn's opener lie)
TRAINED, MASKED = "trained", "masked"


@dataclass(frozen=True)
class TrainerSettings:
    """The trace aggregator's settings as the trainer's default config has them."""

    limits: Limits
    superseded: str


def trainer_settings() -> TrainerSettings:
    """`agentlightning.trace_aggregator` of agl_train/config.yaml: the demo's row is built as a default run's is."""
    config: dict[str, Any] = yaml.safe_load(files("agl_train").joinpath("config.yaml").read_text())
    aggregator = config["agentlightning"]["trace_aggregator"]
    return TrainerSettings(
        limits=limits_for_level(LEVEL_TRAJECTORY, aggregator, config.get("data", {})),
        superseded=str(aggregator["superseded"]),
    )


def training_rows(trace: RolloutTrace, settings: TrainerSettings) -> Aggregation:
    """The rollout's rows at the trajectory level: its calls merged while each prompt continues the last."""
    return aggregate([trace], LEVEL_TRAJECTORY, settings.limits, superseded=settings.superseded)


def how_made(call: LLMCall, sequence_of: dict[str, int | None]) -> str:
    """How the proxy made the call's prompt (`agl.chain`): rendered whole, or bridged from which call's ids."""
    chain = call.chain
    if chain is None:
        return "(no agl.chain)"
    made = chain.prompt
    if chain.parent is not None:
        made += f" from #{sequence_of.get(chain.parent, '?')}"
    if chain.cause:
        made += f" ({chain.cause})"
    return made


def call_lines(trace: RolloutTrace) -> list[str]:
    """One line per call, in the store's sequence order: how its prompt was made, its token counts, why it ended."""
    sequence_of = {call.span_id: call.sequence_id for call in trace.calls}
    width = max((len(how_made(call, sequence_of)) for call in trace.calls), default=0)
    return [
        f"  call #{call.sequence_id}  {how_made(call, sequence_of):<{width}}  prompt {len(call.prompt_ids):>4} tokens"
        f"  answer {len(call.response_ids):>3} tokens  finish={call.finish_reason}"
        for call in trace.calls
    ]


def mask_runs(mask: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """(value, start, end) of each run of equal values in a response mask: where trained and masked tokens alternate."""
    start = 0
    for position in range(1, len(mask) + 1):
        if position == len(mask) or mask[position] != mask[start]:
            yield mask[start], start, position
            start = position


def shown(text: str) -> str:
    """`text` as one short printable line: escaped like a Python string; past `MAX_TEXT` characters its middle
    is left out, so that a masked run still shows the tool result and the template's turn markers at its end."""
    quoted = repr(text)
    if len(quoted) <= MAX_TEXT:
        return quoted
    return quoted[:HEAD_TEXT] + " … " + quoted[len(quoted) - (MAX_TEXT - HEAD_TEXT - 3) :]


def row_lines(row: Row, number: int, count: int, decode: Decode | None) -> list[str]:
    """The row as the trainer builds it: its prompt, and its response run by run, trained or masked."""
    trained = sum(row.response_mask)
    flags = " DROPPED (prompt over the limit)" if row.is_drop else " (response truncated)" if row.truncated else ""
    lines = [
        f"  training row {number} of {count} (trajectory level, as the trainer builds it): "
        f"{row.n_calls} call{'s' if row.n_calls != 1 else ''} merged, reward {row.reward:.2f}{flags}",
        f"    prompt {len(row.prompt_ids)} + response {len(row.response_ids)} tokens: {trained} trained (the model's "
        f"own), {len(row.response_ids) - trained} masked (tool calls and results, chat template)",
    ]
    for value, start, end in mask_runs(row.response_mask):
        text = f"  {shown(decode(row.response_ids[start:end]))}" if decode is not None else ""
        lines.append(f"      {TRAINED if value else MASKED:<7} {end - start:>3}{text}")
    return lines


def rollout_lines(trace: RolloutTrace, aggregation: Aggregation, decode: Decode | None) -> list[str]:
    """Everything printed for one rollout: its calls, then each row they make and any prefix break."""
    lines = call_lines(trace)
    for reason, skipped in sorted(trace.skipped.items()):
        lines.append(f"  {skipped} call(s) not trainable: {reason}")
    for number, row in enumerate(aggregation.rows, 1):
        lines += row_lines(row, number, len(aggregation.rows), decode)
    for record in aggregation.breaks:
        call = trace.calls[record.turn_index] if record.turn_index < len(trace.calls) else None
        at = f"#{call.sequence_id}" if call is not None else f"{record.turn_index + 1}"
        lines.append(f"  prefix break at call {at}: {record.kind}, a new row starts there")
    return lines


def summary(traces: Sequence[RolloutTrace], rows: int) -> str:
    """The demo in one line: how many follow-up calls the proxy bridged, and how many rows the rollouts make."""
    follow_ups = [call for trace in traces for call in trace.calls[1:]]
    bridged = sum(call.chain is not None and call.chain.prompt == "bridged" for call in follow_ups)
    return (
        f"{len(traces)} rollout{'s' if len(traces) != 1 else ''}: {bridged} of {len(follow_ups)} follow-up calls "
        f"bridged from the model's own ids, {rows} training row{'s' if rows != 1 else ''}"
    )
