"""`agl store export --what rows`: the training rows of each rollout, equal to the rows the
trainer's aggregator builds from the same spans."""

from __future__ import annotations

import asyncio
import json
import random
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from agl_store import cli, exporters, reward_span
from agl_store.sqlite import SQLiteStore
from agl_train.core.aggregate import Limits, aggregate
from agl_train.core.traces import trace_from_spans

from ..store.http_server import REPO_ROOT
from ..store.test_span_deltas import conversation, write

UNLIMITED = Limits(max_prompt_length=2**31 - 1, max_response_length=2**31 - 1)


@pytest.fixture(autouse=True)
def declared_exporters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `agl.exporters` entry points as pyproject.toml declares them (an installed checkout
    lists them itself; this one's install may predate them)."""
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    name = exporters.EXPORTERS_ENTRY_POINT_GROUP
    found = [EntryPoint(entry, value, name) for entry, value in declared[name].items()]
    monkeypatch.setattr(exporters, "entry_points", lambda group: found if group == name else [])


async def make_store(path: Path) -> dict[str, Any]:
    """Four succeeded rollouts of branching conversations with a reward; the whole spans of
    each latest attempt, by rollout id, in the order they were started."""
    written: dict[str, Any] = {}
    async with SQLiteStore(path) as store:
        for seed in range(4):
            rollout_id, attempt_id = await write(store, conversation(random.Random(seed), 8), random.Random(seed))
            await store.add_span(reward_span(rollout_id, attempt_id, 0.25 * seed))
            await store.update_attempt(rollout_id, attempt_id, status="succeeded")
            written[rollout_id] = (attempt_id, list(await store.query_spans(rollout_id, attempt_id)))
    return written


@pytest.mark.parametrize("level", ["trajectory", "transition"])
def test_exported_rows_equal_the_rows_the_aggregator_builds(tmp_path: Path, level: str) -> None:
    path = tmp_path / "agl.db"
    written = asyncio.run(make_store(path))
    out = tmp_path / "rows.jsonl"
    command = ["store", "export", "--db", str(path), "--what", "rows", "--output", str(out), "--set", f"level={level}"]
    assert cli.main(command) == 0
    exported = [json.loads(line) for line in out.read_text().splitlines()]

    expected = []
    for rollout_id, (attempt_id, spans) in written.items():
        for row in aggregate([trace_from_spans(rollout_id, spans)], level, UNLIMITED).rows:
            expected.append(
                {
                    "rollout_id": rollout_id,
                    "attempt_id": attempt_id,
                    "level": level,
                    "prompt_ids": list(row.prompt_ids),
                    "response_ids": list(row.response_ids),
                    "response_mask": list(row.response_mask),
                    "logprobs": row.logprobs,
                    "reward": row.reward,
                }
            )
    assert [{key: record[key] for key in expected[0]} for record in exported] == expected
    assert len(expected) >= len(written)
    assert {record["reward"] for record in exported} == {0.0, 0.25, 0.5, 0.75}


def test_rows_settings_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agl.db"
    asyncio.run(make_store(path))
    base = ["store", "export", "--db", str(path), "--what", "rows"]
    assert cli.main([*base, "--set", "level=turn"]) == 2
    assert "level 'turn'; valid levels: ['trajectory', 'transition']" in capsys.readouterr().err
    assert cli.main([*base, "--set", "max_prompt_length=-1"]) == 2
    assert "max_prompt_length must be a positive number of tokens" in capsys.readouterr().err
    assert cli.main([*base, "--set", "tokenizer=/x"]) == 2
    assert "unknown settings ['tokenizer']" in capsys.readouterr().err
