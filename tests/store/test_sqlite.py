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
from typing import Any

import pytest

from agl_store import LLM, ConflictError, InvalidInputError, RolloutConfig, Span, StoreClosedError
from agl_store.errors import StoreError
from agl_store.opening import open_store
from agl_store.sqlite import SQLiteStore, retention, transactions
from agl_store.sqlite.schema import MIGRATIONS, apply_migrations
from agl_store.sqlite.writer import WriteBatcher

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

        all_seqs: list[int] = []
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


async def test_the_write_batcher_sends_one_batch_at_a_time_in_arrival_order() -> None:
    """Writes that arrive while a batch is on the writer's thread go together as the next
    one; a batch that failed as a whole fails each of its writes, and the next still goes;
    a cancelled caller's write is settled without it; drain waits for all of them."""
    sent: list[tuple[list[Any], Any]] = []
    finished: list[bool] = []
    batcher = WriteBatcher(lambda fn, args, done: sent.append((args[0], done)), lambda: finished.append(True))

    def write(value: int) -> Any:
        return asyncio.ensure_future(batcher.write(lambda txn: value))

    first = write(1)
    await asyncio.sleep(0)
    later = [write(2), write(3), write(4)]
    await asyncio.sleep(0)
    assert [len(writes) for writes, _ in sent] == [1]
    sent[0][1]([(True, "one", ())], False)
    assert await first == "one"
    assert [len(writes) for writes, _ in sent] == [1, 3]  # the three waiting, as one batch
    later[1].cancel()
    draining = asyncio.ensure_future(batcher.drain())
    sent[1][1](sqlite3.OperationalError("disk I/O error"), True)  # nothing of it was committed
    for task in (later[0], later[2]):
        with pytest.raises(StoreError, match="disk I/O error"):
            await task
    assert draining.done() or await asyncio.wait_for(draining, 1) is None
    last = write(5)
    await asyncio.sleep(0)
    sent[2][1]([(True, "five", ("ro-1",))], False)
    assert await last == "five" and finished == [True]
    await batcher.drain()


# --- retention: bounded chunks, disk and WAL given back, reads and writes not held up ------------


async def finished_rollout_with_spans(store: SQLiteStore, count: int, text_bytes: int = 100) -> str:
    rollout = await store.start_rollout(input="old")
    await store.add_many_spans(
        [
            Span(
                rollout_id=rollout.rollout_id,
                attempt_id=rollout.attempt.attempt_id,
                name="c",
                attributes={"t": "x" * text_bytes},
            )
            for _ in range(count)
        ]
    )
    await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")
    return rollout.rollout_id


async def test_expiring_everything_truncates_the_wal_and_statistics_report_real_sizes(tmp_path: Path) -> None:
    path = tmp_path / "retention.db"
    wal = Path(str(path) + "-wal")
    async with SQLiteStore(path, retention_chunk_spans=50) as store:
        for _ in range(3):
            await finished_rollout_with_spans(store, 100, text_bytes=8000)
        assert wal.stat().st_size > 1_000_000

        assert await store.expire_rollouts(older_than_seconds=0) == 3

        stats = await store.statistics()
        assert stats.total_spans == stats.total_rollouts == 0
        assert wal.stat().st_size == 0
        assert stats.wal_bytes == 0 and stats.unused_bytes == 0
        assert stats.database_bytes == path.stat().st_size < 1_000_000


async def test_expire_with_nothing_to_expire_reads_the_end_time_index(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "plan.db"):
        pass
    conn = sqlite3.connect(tmp_path / "plan.db")
    try:
        plan = " / ".join(
            row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + retention.EXPIRED_ROLLOUTS_SQL, (1.0, 10))
        )
    finally:
        conn.close()
    assert plan == "SEARCH rollouts USING INDEX rollouts_end_time (end_time<?)"


async def test_reads_do_not_wait_for_a_write_in_progress(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    async with SQLiteStore(path, busy_timeout=10) as store:
        rollout_id = await finished_rollout_with_spans(store, 5)
        other_process = sqlite3.connect(path, isolation_level=None)
        try:
            other_process.execute("BEGIN IMMEDIATE")  # another process writing: the store's writer waits
            expiring = asyncio.create_task(store.expire_rollouts(older_than_seconds=0))
            for _ in range(10):  # let the expire reach the writer's thread
                await asyncio.sleep(0)

            spans = await store.query_spans(rollout_id)
            stats = await store.statistics()

            assert not expiring.done()  # the reads were served while the expire waited
            assert len(spans) == 5 and stats.total_rollouts == 1
        finally:
            other_process.execute("ROLLBACK")
            other_process.close()
        assert await expiring == 1


async def test_other_writes_run_between_retention_chunks(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "chunks.db", retention_chunk_spans=3) as store:
        old = [await finished_rollout_with_spans(store, 4) for _ in range(5)]
        live = await store.start_rollout(input="live")

        expiring = asyncio.create_task(store.expire_rollouts(older_than_seconds=0))
        await asyncio.sleep(0)  # the expire's first chunk is queued
        added = await store.add_span(Span(rollout_id=live.rollout_id, attempt_id=live.attempt.attempt_id, name="s"))

        # The span was committed after the first chunk, long before the last: twenty spans at
        # three a chunk take seven transactions.
        assert added is not None
        assert not expiring.done()
        assert await expiring == 5
        assert await store.query_rollouts(rollout_id_in=old) == []
        assert (await store.statistics()).total_spans == 1


async def test_a_deletion_interrupted_between_chunks_is_finished_by_the_next(tmp_path: Path) -> None:
    path = tmp_path / "resume.db"
    async with SQLiteStore(path) as store:
        rollout_id = await finished_rollout_with_spans(store, 7)

        # The first chunk of a deletion, then the process dies.
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            with transactions.atomic(conn):
                assert retention.delete_finished(transactions.Txn(conn), [rollout_id], 3) == (0, 0)
        finally:
            conn.close()

        left = await store.query_spans(rollout_id)
        assert len(left) == 4 and (await store.get_rollout_by_id(rollout_id)).status == "succeeded"
        assert await store.expire_rollouts(older_than_seconds=0) == 1
        assert await store.query_spans(rollout_id) == [] and await store.get_rollout_by_id(rollout_id) is None


# --- counts kept by the writes ------------------------------------------------------------------


COUNTED = ("spans", "attempts", "resources", "workers")


def counted_and_real(path: Path) -> tuple[dict, dict]:
    """The row counts the triggers kept, and the real ones (both without zeros)."""
    conn = sqlite3.connect(path)
    try:
        counted = dict(conn.execute("SELECT name, value FROM row_counts WHERE value != 0"))
        real = {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in COUNTED}
        by_status = conn.execute("SELECT status, count(*) FROM rollouts GROUP BY status")
        real.update((f"rollouts:{status}", n) for status, n in by_status)
        return counted, {name: n for name, n in real.items() if n}
    finally:
        conn.close()


async def test_row_counts_follow_every_kind_of_write(tmp_path: Path) -> None:
    path = tmp_path / "counts.db"
    async with SQLiteStore(path) as store:
        await store.enqueue_many_rollouts([{"input": i} for i in range(4)])
        claimed = await store.dequeue_many_rollouts(limit=3, worker_id="w")
        first = claimed[0]
        span = Span(rollout_id=first.rollout_id, attempt_id=first.attempt.attempt_id, name="s", span_id="same")
        await store.add_many_spans([span, span])  # a duplicate is not stored, nor counted
        await asyncio.gather(  # one transaction, one write failing in its savepoint
            store.add_span(Span(rollout_id=first.rollout_id, attempt_id=first.attempt.attempt_id, name="t")),
            store.add_span(Span(rollout_id="ro-missing", attempt_id="at-x", name="t")),
            return_exceptions=True,
        )
        await store.update_attempt(first.rollout_id, "latest", status="succeeded")
        await store.update_attempt(claimed[1].rollout_id, "latest", status="failed")
        await store.update_rollout(claimed[2].rollout_id, status="cancelled")
        await store.add_resources({"llm": LLM(endpoint="http://x/v1", model="m")})
        await store.update_worker("w2")
        await store.delete_rollouts([claimed[1].rollout_id])

        counted, real = counted_and_real(path)
        assert counted == real
        stats = await store.statistics()
        assert stats.rollouts_by_status == {"succeeded": 1, "cancelled": 1, "queuing": 1}
        assert (stats.total_spans, stats.total_attempts, stats.total_workers) == (2, 2, 2)


async def test_a_database_from_before_row_counts_is_counted_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "older.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        apply_migrations(conn, MIGRATIONS[:2])
        for i, status in enumerate(["queuing", "succeeded", "succeeded"]):
            conn.execute(
                "INSERT INTO rollouts (rollout_id, input, start_time, status, config) VALUES (?, '1', 0, ?, '{}')",
                (f"ro-{i}", status),
            )
        conn.execute(
            "INSERT INTO spans (rollout_id, attempt_id, sequence_id, trace_id, span_id, name, status_code, "
            "attributes, rest) VALUES ('ro-1', 'at-1', 1, 't', 's', 'n', 'OK', '{}', '{}')"
        )
    finally:
        conn.close()

    async with SQLiteStore(path) as store:
        stats = await store.statistics()
        assert stats.rollouts_by_status == {"queuing": 1, "succeeded": 2} and stats.total_spans == 1
        await store.enqueue_rollout(input=2)
        assert (await store.statistics()).rollouts_by_status["queuing"] == 2
    assert counted_and_real(path)[0] == counted_and_real(path)[1]


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


async def test_attempt_metadata_is_stored_as_its_check_encoded_it(tmp_path: Path) -> None:
    # The same encoding as a rollout's metadata: non-string keys become strings, a model becomes its JSON.
    async with SQLiteStore(str(tmp_path / "agl.db")) as store:
        rollout = await store.start_rollout(input="q")
        metadata = {1: "one", "config": RolloutConfig(max_attempts=2)}
        await store.update_attempt(rollout.rollout_id, "latest", metadata=metadata)
        await store.update_rollout(rollout.rollout_id, metadata=metadata)
        await store.update_attempt(rollout.rollout_id, "latest", status="running")  # keeps the stored metadata

        attempt = await store.get_latest_attempt(rollout.rollout_id)
        stored = await store.get_rollout_by_id(rollout.rollout_id)
        assert attempt is not None and stored is not None
        assert attempt.metadata == stored.metadata == {"1": "one", "config": RolloutConfig(max_attempts=2).model_dump()}
