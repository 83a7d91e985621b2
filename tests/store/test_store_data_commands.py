"""`agl store stats`, `agl store export` and `agl store expire` on a real store file made
through the API: what they print, what they write, what they delete."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agl_store import cli
from agl_store.models import LLM, Span, reward_span
from agl_store.sqlite import SQLiteStore

from .http_server import REPO_ROOT, StoreServerProcess
from .test_span_deltas import linear_conversation

TURNS = 3


async def make_store(path: Path) -> dict[str, list[str]]:
    """Three training steps (a resource set each) of two succeeded train rollouts with three
    calls and a reward each, a failed val rollout of step 3 and a running one. The rollout ids
    by what they are."""
    made: dict[str, list[str]] = {"step1": [], "step2": [], "step3": [], "val": [], "running": []}
    rng = random.Random(5)
    async with SQLiteStore(path) as store:
        for step in (1, 2, 3):
            resources = await store.add_resources({"main_llm": LLM(endpoint=f"http://step{step}/v1", model="m")})
            for _ in range(2):
                rollout = await store.start_rollout({"q": step}, mode="train", resources_id=resources.resources_id)
                ids = {"rollout_id": rollout.rollout_id, "attempt_id": rollout.attempt.attempt_id}
                spans = [s.model_copy(update=ids) for s in linear_conversation(rng, TURNS)]
                await store.add_many_spans([*spans, reward_span(**ids, value=0.5 * step)])
                await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")
                made[f"step{step}"].append(rollout.rollout_id)
        val = await store.start_rollout({"q": 0}, mode="val", resources_id=resources.resources_id)
        await store.update_attempt(val.rollout_id, "latest", status="failed")
        made["val"].append(val.rollout_id)
        running = await store.start_rollout({"q": 9}, mode="train")
        await store.add_span(Span(rollout_id=running.rollout_id, attempt_id=running.attempt.attempt_id, name="tool"))
        made["running"].append(running.rollout_id)
    return made


@pytest.fixture
def store_file(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    path = tmp_path / "agl.db"
    return path, asyncio.run(make_store(path))


def agl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The `agl` command, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "agl_store.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", **(env or {})},
        timeout=120,
    )


def span_rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM spans").fetchone()[0])


def test_stats_counts_rollouts_by_status_and_mode_and_spans(store_file: tuple[Path, dict[str, list[str]]]) -> None:
    path, _ = store_file
    done = agl("store", "stats", "--db", str(path), "--json")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["total_rollouts"] == 8
    assert stats["total_spans"] == 6 * (TURNS + 1) + 1 == span_rows(path)
    assert stats["rollouts_by_status_and_mode"] == {
        "failed": {"val": 1},
        "running": {"train": 1},
        "succeeded": {"train": 6},
    }
    assert stats["database_bytes"] >= path.stat().st_size
    assert stats["first_rollout_start_time"] <= stats["last_rollout_start_time"]
    table = agl("store", "stats", "--db", str(path)).stdout
    assert "spans      25" in table
    assert "succeeded   train            6" in table


def test_export_spans_round_trips_every_span(
    store_file: tuple[Path, dict[str, list[str]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, made = store_file
    out = tmp_path / "spans.jsonl"
    assert cli.main(["store", "export", "--db", str(path), "--what", "spans", "--output", str(out)]) == 0
    assert "exported 8/8 rollouts" in capsys.readouterr().err
    exported = [Span.model_validate_json(line) for line in out.read_text().splitlines()]

    async def stored() -> list[Span]:
        async with SQLiteStore(path) as store:
            rollouts = await store.query_rollouts(sort_by="start_time")
            return [span for rollout in rollouts for span in await store.query_spans(rollout.rollout_id)]

    assert exported == asyncio.run(stored())
    # One rollout, to stdout.
    only = made["step2"][0]
    assert cli.main(["store", "export", "--db", str(path), "--what", "spans", "--rollout-ids", only]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == TURNS + 1 and {json.loads(line)["rollout_id"] for line in lines} == {only}


def test_export_as_parquet_filtered_by_mode_and_status(
    store_file: tuple[Path, dict[str, list[str]]], tmp_path: Path
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    path, made = store_file
    out = tmp_path / "spans.parquet"
    args = ["store", "export", "--db", str(path), "--what", "spans", "--format", "parquet", "--output", str(out)]
    assert cli.main([*args, "--mode", "train", "--status", "succeeded"]) == 0
    table = pq.read_table(out)
    assert table.num_rows == 6 * (TURNS + 1)
    assert set(table.column("rollout_id").to_pylist()) == {*made["step1"], *made["step2"], *made["step3"]}
    assert all(json.loads(text)["agl.request"] for text in table.column("attributes").to_pylist()[:TURNS])


def test_expire_dry_run_deletes_nothing_and_the_real_run_deletes_what_it_listed(
    store_file: tuple[Path, dict[str, list[str]]],
) -> None:
    path, made = store_file
    before = span_rows(path)
    dry = agl("store", "expire", "--db", str(path), "--keep-steps", "1", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would delete 4 rollouts, 16 spans")
    listed = {line.split()[0] for line in dry.stdout.splitlines()[1:]}
    assert listed == {*made["step1"], *made["step2"]}
    assert span_rows(path) == before

    refused = agl("store", "expire", "--db", str(path), "--keep-steps", "1")  # no terminal to ask on
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert span_rows(path) == before

    real = agl("store", "expire", "--db", str(path), "--keep-steps", "1", "--yes")
    assert real.returncode == 0, real.stderr
    assert real.stdout.splitlines()[-1] == "deleted 4 rollouts"
    with sqlite3.connect(path) as conn:
        left = {row[0] for row in conn.execute("SELECT rollout_id FROM rollouts")}
    assert left == {*made["step3"], *made["val"], *made["running"]}
    assert span_rows(path) == before - 16


def test_expire_by_step_and_by_age(store_file: tuple[Path, dict[str, list[str]]]) -> None:
    path, made = store_file
    assert cli.main(["store", "expire", "--db", str(path), "--before-step", "2", "--yes"]) == 0
    assert cli.main(["store", "expire", "--db", str(path), "--older-than", "1h", "--yes"]) == 0  # none that old
    with sqlite3.connect(path) as conn:
        left = {row[0] for row in conn.execute("SELECT rollout_id FROM rollouts")}
    assert left == {*made["step2"], *made["step3"], *made["val"], *made["running"]}
    assert cli.main(["store", "expire", "--db", str(path), "--older-than", "0s", "--yes"]) == 0
    with sqlite3.connect(path) as conn:
        left = {row[0] for row in conn.execute("SELECT rollout_id FROM rollouts")}
    assert left == set(made["running"])  # never one that is not finished


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stats", "--db", "missing.db"], "no store file at missing.db"),
        (["export", "--db", "{db}", "--what", "tokens"], "unknown export 'tokens'"),
        (["export", "--db", "{db}", "--what", "spans", "--set", "x"], "expected KEY=VALUE"),
        (["export", "--db", "{db}", "--what", "spans", "--set", "level=trajectory"], "takes no settings"),
        (["export", "--db", "{db}", "--what", "spans", "--format", "parquet"], "needs --output FILE"),
        (["expire", "--db", "{db}", "--older-than", "7 days"], "expected a number and a unit"),
        (["expire", "--db", "{db}", "--keep-steps", "0"], "expected a positive number of steps"),
        (["expire", "--db", "{db}", "--before-step", "0"], "steps are counted from 1"),
        (["expire", "--db", "{db}", "--keep-steps", "1", "--older-than", "7d"], "not allowed with argument"),
        (["expire", "--db", "{db}"], "one of the arguments --older-than --keep-steps --before-step is required"),
    ],
)
def test_bad_arguments_are_a_clear_error_and_exit_2(
    store_file: tuple[Path, dict[str, list[str]]], args: list[str], message: str
) -> None:
    path, _ = store_file
    before = span_rows(path)
    done = agl("store", *[arg.replace("{db}", str(path)) for arg in args])
    assert done.returncode == 2
    assert message in done.stderr
    assert span_rows(path) == before


async def test_stats_and_a_dry_run_of_a_served_store_with_a_key(store_file: tuple[Path, dict[str, list[str]]]) -> None:
    path, made = store_file
    server = StoreServerProcess(path, key="secret")
    await server.start()
    try:
        env = {"AGL_STORE_KEY": "secret"}
        stats = json.loads(
            (await asyncio.to_thread(agl, "store", "stats", "--db", server.url, "--json", env=env)).stdout
        )
        dry = await asyncio.to_thread(
            agl, "store", "expire", "--db", server.url, "--before-step", "2", "--dry-run", env=env
        )
        refused = await asyncio.to_thread(agl, "store", "stats", "--db", server.url)  # no key
    finally:
        await server.stop()
    assert stats["total_spans"] == span_rows(path) and stats["total_rollouts"] == 8
    assert {line.split()[0] for line in dry.stdout.splitlines()[1:]} == set(made["step1"])
    assert refused.returncode == 2 and "missing bearer key" in refused.stderr
