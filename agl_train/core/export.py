"""`agl store export --what rows`: each rollout's training rows, as the trainer builds them.

The `agl.exporters` entry point `rows`: the rollout's latest attempt read as the trainer reads
it (`traces.read_rollout`), turned into rows by `aggregate` at the chosen level, one record
per row with the ids, mask, logprobs and reward an SFT or offline-analysis user needs.
Settings (`--set KEY=VALUE`): `level` (trajectory, the default, or transition),
`max_prompt_length` and `max_response_length` (tokens; unlimited by default: a row over the
prompt limit is marked `is_drop`, a response over its limit is cut and marked `truncated`).
"""

from __future__ import annotations

from collections.abc import Mapping

from agl_store.base import LightningStore
from agl_store.exporters import Exporter, ExporterFactory, Record
from agl_store.models import Rollout

from .aggregate import AGGREGATORS, Limits, Row, aggregate
from .traces import read_rollout

UNLIMITED = 2**31 - 1
_SETTINGS = ("level", "max_prompt_length", "max_response_length")


def row_record(row: Row, attempt_id: str, level: str) -> Record:
    """One row as an exported record."""
    return {
        "rollout_id": row.rollout_id,
        "attempt_id": attempt_id,
        "level": level,
        "turn_index": row.turn_index,
        "n_calls": row.n_calls,
        "prompt_ids": list(row.prompt_ids),
        "response_ids": list(row.response_ids),
        "response_mask": list(row.response_mask),
        "logprobs": row.logprobs,
        "reward": row.reward,
        "is_drop": row.is_drop,
        "truncated": row.truncated,
    }


def _length(settings: Mapping[str, str], key: str) -> int:
    value = settings.get(key)
    if value is None:
        return UNLIMITED
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"rows export: {key} must be a positive number of tokens, got {value!r}")
    return int(value)


def rows_exporter(settings: Mapping[str, str]) -> Exporter:
    """The `agl.exporters` entry point `rows`."""
    unknown = sorted(set(settings) - set(_SETTINGS))
    if unknown:
        raise ValueError(f"rows export: unknown settings {unknown}; it takes {list(_SETTINGS)}")
    level = settings.get("level", "trajectory")
    if level not in AGGREGATORS:
        raise ValueError(f"rows export: level {level!r}; valid levels: {sorted(AGGREGATORS)}")
    limits = Limits(_length(settings, "max_prompt_length"), _length(settings, "max_response_length"))

    async def records(store: LightningStore, rollout: Rollout) -> list[Record]:
        trace = await read_rollout(store, rollout.rollout_id)
        rows = aggregate([trace], level, limits).rows
        return [row_record(row, trace.attempt_id, level) for row in rows]

    return Exporter(records, f"the training rows of each rollout's latest attempt, at level {level}")


_IMPLEMENTS: ExporterFactory = rows_exporter  # mypy checks the entry point against the store's spec
