"""What only the SQLite backend promises: files that persist, a migrated schema, several
processes on one file, acknowledged writes that survive a killed process, store URLs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import List

import pytest

from agl_store import LLM, ConflictError, InvalidInputError, RolloutConfig, Span, StoreClosedError
from agl_store.sqlite import SQLiteStore
from agl_store.sqlite_schema import MIGRATIONS, apply_migrations
from agl_store.urls import open_store

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_reopening_a_file_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with SQLiteStore(path) as store:
        resources = await store.add_resources({"llm": LLM(endpoint="http://x/v1", model="m")})
        running = await store.start_rollout(input={"q": 1}, config=RolloutConfig(max_attempts=2), worker_id="w")
        span = await store.add_span(
            Span(
                rollout_id=running.rollout_id,
                attempt_id=running.attempt.attempt_id,
                name="c",
                attributes={"ids": list(range(50))},
            )
        )
        queued = [await store.enqueue_rollout(input=i) for i in range(2)]

    async with SQLiteStore(path) as store:
        again = await store.get_rollout_by_id(running.rollout_id)
        assert again is not None and again.status == "running" and again.resources_id == resources.resources_id
        assert (await store.query_spans(running.rollout_id)) == [span]
        assert await store.get_next_span_sequence_id(running.rollout_id, running.attempt.attempt_id) == 2
        assert (await store.get_latest_resources()) == resources
        assert (await store.get_worker_by_id("w")).status == "busy"
        assert [(await store.dequeue_rollout()).rollout_id for _ in queued] == [r.rollout_id for r in queued]
        stats = await store.statistics()
        assert stats.total_spans == 1 and stats.database_bytes and stats.database_bytes > 0


async def test_memory_store_starts_empty_every_time() -> None:
    async with SQLiteStore(":memory:") as store:
        await store.enqueue_rollout(input=1)
    async with SQLiteStore() as store:
        stats = await store.statistics()
        assert stats.total_rollouts == 0 and stats.database_bytes is None


def test_schema_is_migrated_once_and_recorded(tmp_path: Path) -> None:
    path = tmp_path / "schema.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert apply_migrations(conn) == [name for name, _ in MIGRATIONS]
        assert apply_migrations(conn) == []  # a second process opening the file changes nothing
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)

        # A later release appends a migration: existing files pick it up, in order.
        later = (*MIGRATIONS, ("9999_add_notes", ("ALTER TABLE rollouts ADD COLUMN notes TEXT",)))
        assert apply_migrations(conn, later) == ["9999_add_notes"]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(later)
        names = [row[0] for row in conn.execute("SELECT name FROM schema_migrations ORDER BY rowid")]
        assert names == [name for name, _ in later]
    finally:
        conn.close()


async def test_file_store_uses_wal_and_foreign_keys(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "wal.db"):
        conn = sqlite3.connect(tmp_path / "wal.db")
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert {row[1] for row in conn.execute("PRAGMA index_list(spans)")} >= {
                "spans_by_sequence",
                "spans_identity",
            }
        finally:
            conn.close()


async def test_lifecycle_errors_and_urls(tmp_path: Path) -> None:
    fresh = SQLiteStore(tmp_path / "never-opened.db")
    with pytest.raises(StoreClosedError, match="not open"):
        await fresh.enqueue_rollout(input=1)

    store = await open_store(f"sqlite:///{tmp_path / 'url.db'}")
    await store.enqueue_rollout(input=1)
    await store.close()
    await store.close()  # closing twice is fine
    with pytest.raises(StoreClosedError):
        await store.query_rollouts()
    with pytest.raises(StoreClosedError):
        await store.open()
    assert (tmp_path / "url.db").exists()

    memory = await open_store("memory://")
    assert isinstance(memory, SQLiteStore) and memory.in_memory
    await memory.close()
    with pytest.raises(InvalidInputError, match="ftp"):
        await open_store("ftp://example.com/store")


# --- several processes on one file -------------------------------------------------------------

WORKER_SCRIPT = """
import asyncio, json, sys
from agl_store import Span
from agl_store.sqlite import SQLiteStore

async def main(path, rollout_id, attempt_id, rounds):
    seqs, claimed = [], []
    async with SQLiteStore(path, watchdog_interval=0.05) as store:
        for i in range(rounds):
            seqs.append(await store.get_next_span_sequence_id(rollout_id, attempt_id))
            stored = await store.add_span(Span(rollout_id=rollout_id, attempt_id=attempt_id, name="p"))
            seqs.append(stored.sequence_id)
            rollout = await store.dequeue_rollout()
            if rollout is not None:
                claimed.append(rollout.rollout_id)
    print(json.dumps({"seqs": seqs, "claimed": claimed}))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


async def run_python(*args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )


async def test_two_processes_share_sequence_ids_and_the_queue(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    async with SQLiteStore(path) as store:
        target = await store.start_rollout(input="shared")
        queued = [r.rollout_id for r in await store.enqueue_many_rollouts([{"input": i} for i in range(60)])]

        processes = [
            await run_python(WORKER_SCRIPT, path, target.rollout_id, target.attempt.attempt_id, "40") for _ in range(2)
        ]
        results = []
        for process in processes:
            out, err = await process.communicate()
            assert process.returncode == 0, err.decode()
            results.append(json.loads(out))

        all_seqs: List[int] = []
        for result in results:
            assert result["seqs"] == sorted(result["seqs"]) and len(set(result["seqs"])) == len(result["seqs"])
            all_seqs += result["seqs"]
        assert len(set(all_seqs)) == len(all_seqs) == 160  # unique across processes

        claimed = results[0]["claimed"] + results[1]["claimed"]
        assert len(claimed) == len(set(claimed)) == 60  # nobody got a rollout twice
        assert set(claimed) == set(queued)
        for result in results:  # each process saw the queue in FIFO order
            assert result["claimed"] == sorted(result["claimed"], key=queued.index)

        spans = await store.query_spans(target.rollout_id)
        assert len(spans) == 80 and len({s.sequence_id for s in spans}) == 80


OPENER_SCRIPT = """
import asyncio, sys
from agl_store.sqlite import SQLiteStore

async def main(path):
    async with SQLiteStore(path) as store:
        for i in range(5):
            await store.enqueue_rollout(input=i)

asyncio.run(main(sys.argv[1]))
"""


async def test_processes_opening_a_new_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    path = str(tmp_path / "fresh.db")

    processes = [await run_python(OPENER_SCRIPT, path) for _ in range(3)]
    for process in processes:
        _, err = await process.communicate()
        assert process.returncode == 0, err.decode()

    async with SQLiteStore(path) as store:
        assert (await store.statistics()).total_rollouts == 15
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == len(MIGRATIONS)
    finally:
        conn.close()


KILLED_WRITER_SCRIPT = """
import asyncio, sys
from agl_store.sqlite import SQLiteStore

async def main(path):
    async with SQLiteStore(path) as store:
        while True:
            rollout = await store.enqueue_rollout(input="durable")
            print(rollout.rollout_id, flush=True)  # acknowledged: the commit returned

asyncio.run(main(sys.argv[1]))
"""


async def test_acknowledged_writes_survive_a_killed_process(tmp_path: Path) -> None:
    path = str(tmp_path / "killed.db")
    process = await run_python(KILLED_WRITER_SCRIPT, path)
    assert process.stdout is not None
    acknowledged = [(await process.stdout.readline()).decode().strip() for _ in range(30)]
    process.send_signal(signal.SIGKILL)
    await process.wait()

    async with SQLiteStore(path) as store:
        found = await store.query_rollouts(rollout_id_in=acknowledged)
        assert {r.rollout_id for r in found} == set(acknowledged)


async def test_watchdogs_of_two_stores_on_one_file_act_once(tmp_path: Path) -> None:
    path = tmp_path / "two-watchdogs.db"
    async with SQLiteStore(path, watchdog_interval=0.02) as first, SQLiteStore(path, watchdog_interval=0.02) as second:
        config = RolloutConfig(unresponsive_seconds=0.1, max_attempts=3, retry_condition=["unresponsive"])
        started = await first.start_rollout(input="quiet", config=config)

        deadline = asyncio.get_running_loop().time() + 30
        while (await second.get_rollout_by_id(started.rollout_id)).status != "requeuing":
            assert asyncio.get_running_loop().time() < deadline, "no watchdog marked the attempt"
            await asyncio.sleep(0.02)

        retry = await second.dequeue_rollout()
        assert retry is not None and retry.attempt.sequence_id == 2
        assert await first.dequeue_rollout() is None  # requeued once, not once per watchdog


async def test_wait_for_rollouts_notices_another_process_finishing(tmp_path: Path) -> None:
    path = tmp_path / "waiting.db"
    async with SQLiteStore(path, poll_interval=0.05) as waiter, SQLiteStore(path) as worker:
        started = await worker.start_rollout(input="x")
        waiting = asyncio.create_task(waiter.wait_for_rollouts(rollout_ids=[started.rollout_id], timeout=30))
        await asyncio.sleep(0.1)
        assert not waiting.done()

        await worker.update_attempt(started.rollout_id, "latest", status="succeeded")

        (finished,) = await waiting
        assert finished.status == "succeeded"


async def test_spans_read_back_equal_to_what_was_written(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "spans.db") as store:
        rollout = await store.start_rollout(input=None)
        span = Span(
            rollout_id=rollout.rollout_id,
            attempt_id=rollout.attempt.attempt_id,
            sequence_id=7,
            name="agent.step",
            parent_id="p0",
            status={"status_code": "ERROR", "description": "boom"},
            attributes={"ids": list(range(20)), "nested": {"ids": list(range(10)), "flag": True}},
            events=[{"name": "retry", "attributes": {"n": 2}, "timestamp": 1.5}],
            links=[{"context": {"trace_id": "t" * 32, "span_id": "s" * 16, "vendor": "x"}, "attributes": {"k": 1}}],
            start_time=10.0,
            end_time=11.5,
            context={"trace_id": "a" * 32, "span_id": "b" * 16, "is_remote": False},
            parent={"trace_id": "a" * 32, "span_id": "c" * 16, "is_remote": True, "trace_state": {"k": "v"}},
            resource={"attributes": {"service.name": "agent"}, "schema_url": "https://schema"},
            custom_field={"kept": ["as", "is"]},
        )

        await store.add_span(span)
        (read,) = await store.query_spans(rollout.rollout_id)

        assert read == span
        assert read.model_dump_json() == span.model_dump_json()


async def test_deleting_rollouts_gives_disk_space_back(tmp_path: Path) -> None:
    path = tmp_path / "space.db"
    async with SQLiteStore(path) as store:
        rollout = await store.start_rollout(input="big")
        spans = [
            Span(
                rollout_id=rollout.rollout_id,
                attempt_id=rollout.attempt.attempt_id,
                name="c",
                attributes={"text": "x" * 4000},
            )
            for _ in range(200)
        ]
        await store.add_many_spans(spans)
        await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")

        assert await store.delete_rollouts([rollout.rollout_id]) == 1

        conn = sqlite3.connect(path)
        try:
            assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
            assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0
        finally:
            conn.close()


async def test_writes_accepted_before_close_are_committed(tmp_path: Path) -> None:
    path = tmp_path / "closing.db"
    store = await SQLiteStore(path).open()
    rollout = await store.start_rollout(input=None)
    pending = [
        asyncio.create_task(
            store.add_span(Span(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id, name="s"))
        )
        for _ in range(20)
    ]
    await asyncio.sleep(0)  # the calls are in, their commit is not done yet

    await store.close()

    assert all(isinstance(span, Span) for span in await asyncio.gather(*pending))
    async with SQLiteStore(path) as reopened:
        assert len(await reopened.query_spans(rollout.rollout_id)) == 20


async def test_a_counter_left_at_the_int64_top_issues_no_float_ids(tmp_path: Path) -> None:
    # Before ids were bounded, a span could bring 2^63 - 1 and the next id overflowed to a float.
    path = tmp_path / "store.db"
    async with SQLiteStore(path) as store:
        rollout = await store.start_rollout(input=None)
        span = Span(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id, name="s")
        await store.add_span(span)
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE span_counters SET value = ?", (2**63 - 1,))
        with pytest.raises(ConflictError, match="no sequence ids left"):
            await store.add_span(span.model_copy(update={"span_id": "b" * 16}))
        assert [s.sequence_id for s in await store.query_spans(rollout.rollout_id)] == [1]


async def test_numbers_past_the_largest_double_are_invalid_input() -> None:
    async with SQLiteStore() as store:
        rollout = await store.start_rollout(input=None)
        with pytest.raises(InvalidInputError, match="start_time_after is out of range"):
            await store.query_rollouts(start_time_after=10**400)
        with pytest.raises(InvalidInputError, match="last_heartbeat_time is out of range"):
            await store.update_attempt(rollout.rollout_id, "latest", last_heartbeat_time=10**400)
