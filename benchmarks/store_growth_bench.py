"""How the embedded SQLite store's costs grow with the data in it.

    .venv/bin/python benchmarks/store_growth_bench.py                 # 1k, 100k, 500k spans (~4 GB of disk, minutes)
    .venv/bin/python benchmarks/store_growth_bench.py --quick         # 1k, 10k, 50k spans
    .venv/bin/python benchmarks/store_growth_bench.py --sizes 1000,20000,100000 --json artifacts/growth.json

One SQLiteStore on a file is grown step by step (LLM-call spans of ~10 KB, `SPANS_PER_ROLLOUT`
to a rollout, most rollouts finished, some failed, running or queued) and at each size the same
operations are timed, each `--repeats` times; the table shows medians and, per line, the growth
factor: the median at the largest size over the median at the smallest. The smallest size is the
baseline, run in the same process on the same machine, so a factor near 1 means "does not grow".

At the largest size the benchmark then expires every finished rollout while a reader and a writer
keep calling the store, and reports how long the expire took, the largest `-wal` file seen during
it, the files' sizes afterwards, and the worst wait of the reader's and writer's calls meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(1, str(BENCH_DIR.parent))

import _workload as wl  # noqa: E402

from agl_store import Span  # noqa: E402
from agl_store.sqlite import SQLiteStore  # noqa: E402

SPANS_PER_ROLLOUT = 8
"""A multi-turn agent's LLM calls per rollout."""
PAGE = 50
"""Rollouts per page, as the web view lists them."""
DEEP_OFFSET = 100
"""The deep page's offset: past the first pages, and within the smallest size's rollouts."""
INGEST_BATCH = 100
GROW_BATCH_ROLLOUTS = 64
FILTER = ["succeeded", "failed"]

SIZES = (1_000, 100_000, 500_000)
QUICK_SIZES = (1_000, 10_000, 50_000)


class Grower:
    """Adds rollouts with their spans until the store holds a given number of spans."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.payloads = wl.payload_pool()
        self.spans = 0
        self.rollouts = 0

    def make_spans(self, rollout_id: str, attempt_id: str, count: int) -> list[Span]:
        return [
            Span(**wl.span_fields(self.payloads[(self.spans + i) % len(self.payloads)], rollout_id, attempt_id, i + 1))
            for i in range(count)
        ]

    async def grow_to(self, spans: int, log: Callable[[str], None]) -> None:
        started = time.perf_counter()
        while self.spans < spans:
            count = min(GROW_BATCH_ROLLOUTS, -(-(spans - self.spans) // SPANS_PER_ROLLOUT))
            await self.store.enqueue_many_rollouts([{"input": {"q": self.rollouts + i}} for i in range(count)])
            claimed = await self.store.dequeue_many_rollouts(limit=count, worker_id="grower")
            batch: list[Span] = []
            for rollout in claimed:
                batch += self.make_spans(rollout.rollout_id, rollout.attempt.attempt_id, SPANS_PER_ROLLOUT)
            await self.store.add_many_spans(batch)
            for index, rollout in enumerate(claimed):
                number = self.rollouts + index
                if number % 50 == 7:
                    continue  # stays running
                status = "failed" if number % 10 == 3 else "succeeded"
                await self.store.update_attempt(rollout.rollout_id, "latest", status=status)
            self.rollouts += len(claimed)
            self.spans += len(batch)
            if self.rollouts % (GROW_BATCH_ROLLOUTS * 40) < GROW_BATCH_ROLLOUTS:
                log(f"  grown to {self.spans:,} spans ({time.perf_counter() - started:.0f} s)")
        # A few queued rollouts, as a store under use has.
        await self.store.enqueue_many_rollouts([{"input": {"q": "waiting"}} for _ in range(20)])


async def timed(repeats: int, call: Callable[[], Awaitable[Any]]) -> float:
    """Median milliseconds of `repeats` calls."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


async def measure_size(store: SQLiteStore, grower: Grower, repeats: int) -> dict[str, float]:
    """Median ms of each operation at the store's current size."""
    results: dict[str, float] = {}
    reader = (await store.query_rollouts(status_in=["succeeded"], limit=1))[0]

    async def ingest() -> None:
        rollout = await store.start_rollout(input="ingest")
        await store.add_many_spans(grower.make_spans(rollout.rollout_id, rollout.attempt.attempt_id, INGEST_BATCH))
        await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")

    results["ingest"] = await timed(repeats, ingest)
    results["query_spans"] = await timed(repeats, lambda: store.query_spans(reader.rollout_id, "latest"))
    results["rollouts_offset0"] = await timed(
        repeats, lambda: store.query_rollouts(status_in=FILTER, sort_order="desc", limit=PAGE, offset=0)
    )
    results["rollouts_deep"] = await timed(
        repeats, lambda: store.query_rollouts(status_in=FILTER, sort_order="desc", limit=PAGE, offset=DEEP_OFFSET)
    )
    await store.enqueue_many_rollouts([{"input": {"q": "dequeue"}} for _ in range(repeats)])
    results["dequeue"] = await timed(repeats, lambda: store.dequeue_rollout(worker_id="bench"))
    results["expire_nothing"] = await timed(repeats, lambda: store.expire_rollouts(older_than_seconds=10 * 365 * 86400))
    results["statistics"] = await timed(repeats, store.statistics)
    return results


LINES = (
    ("ingest", f"ingest: start + add_many_spans x{INGEST_BATCH} + finish"),
    ("query_spans", f"query_spans, {SPANS_PER_ROLLOUT}-span rollout"),
    ("rollouts_offset0", f"query_rollouts {'+'.join(FILTER)}, page {PAGE} at offset 0"),
    ("rollouts_deep", f"query_rollouts {'+'.join(FILTER)}, page {PAGE} at offset {DEEP_OFFSET}"),
    ("dequeue", "dequeue_rollout"),
    ("expire_nothing", "expire_rollouts, nothing to expire"),
    ("statistics", "statistics()"),
)


def file_bytes(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


async def expire_under_load(store: SQLiteStore, grower: Grower, db: Path) -> dict[str, float]:
    """Expire every finished rollout while a reader and a writer keep calling the store."""
    wal = Path(str(db) + "-wal")
    done = asyncio.Event()
    waits: dict[str, list[float]] = {"read": [], "write": []}
    peak_wal = file_bytes(wal)
    target = (await store.query_rollouts(status_in=["running"], limit=1))[0]
    writer_rollout = await store.start_rollout(input="writer during expire")

    async def reader() -> None:
        while not done.is_set():
            started = time.perf_counter()
            await store.query_spans(target.rollout_id, "latest")
            waits["read"].append(time.perf_counter() - started)
            await asyncio.sleep(0.01)

    async def writer() -> None:
        attempt_id = writer_rollout.attempt.attempt_id
        sequence = 0
        while not done.is_set():
            spans = [
                Span(**wl.span_fields(grower.payloads[0], writer_rollout.rollout_id, attempt_id, sequence + i + 1))
                for i in range(10)
            ]
            sequence += 10
            started = time.perf_counter()
            await store.add_many_spans(spans)
            waits["write"].append(time.perf_counter() - started)
            await asyncio.sleep(0.01)

    async def watch_wal() -> None:
        nonlocal peak_wal
        while not done.is_set():
            peak_wal = max(peak_wal, file_bytes(wal))
            await asyncio.sleep(0.05)

    helpers = [asyncio.create_task(fn()) for fn in (reader, writer, watch_wal)]
    await asyncio.sleep(0.05)
    spans_before = (await store.statistics()).total_spans
    started = time.perf_counter()
    expired = await store.expire_rollouts(older_than_seconds=0)
    elapsed = time.perf_counter() - started
    done.set()
    await asyncio.gather(*helpers)
    stats = await store.statistics()
    return {
        "expired_rollouts": expired,
        "expired_spans": spans_before - stats.total_spans,
        "seconds": elapsed,
        "peak_wal_bytes": peak_wal,
        "db_bytes_after": file_bytes(db),
        "wal_bytes_after": file_bytes(wal),
        "reported_database_bytes": stats.database_bytes or 0,
        "worst_read_wait_ms": max(waits["read"], default=0.0) * 1000.0,
        "worst_write_wait_ms": max(waits["write"], default=0.0) * 1000.0,
        "reads_during": len(waits["read"]),
        "writes_during": len(waits["write"]),
    }


def render(sizes: Sequence[int], by_size: dict[int, dict[str, float]]) -> str:
    head = f"{'operation (median ms)':<56}" + "".join(f"{f'{s:,} spans':>15}" for s in sizes) + f"{'growth':>9}"
    rows = [head, "-" * len(head)]
    for key, label in LINES:
        values = [by_size[s][key] for s in sizes]
        growth = values[-1] / values[0] if values[0] > 0 else float("nan")
        rows.append(f"{label:<56}" + "".join(f"{v:>15.2f}" for v in values) + f"{growth:>8.1f}x")
    return "\n".join(rows)


def render_expire(size: int, result: dict[str, float]) -> str:
    mb = 1024 * 1024
    return "\n".join(
        [
            f"expire every finished rollout at {size:,} spans, a reader and a writer running:",
            f"  expired {result['expired_rollouts']:,} rollouts, {result['expired_spans']:,} spans "
            f"in {result['seconds']:.2f} s",
            f"  -wal file: peak {result['peak_wal_bytes'] / mb:.1f} MB, after {result['wal_bytes_after'] / mb:.1f} MB;"
            f" database file after {result['db_bytes_after'] / mb:.1f} MB;"
            f" statistics().database_bytes {result['reported_database_bytes'] / mb:.1f} MB",
            f"  worst wait meanwhile: query_spans {result['worst_read_wait_ms']:.0f} ms"
            f" ({result['reads_during']} calls), add_many_spans x10 {result['worst_write_wait_ms']:.0f} ms"
            f" ({result['writes_during']} calls)",
        ]
    )


async def run(sizes: Sequence[int], repeats: int, folder: Path, log: Callable[[str], None]) -> dict[str, Any]:
    db = folder / "growth.db"
    by_size: dict[int, dict[str, float]] = {}
    async with SQLiteStore(db) as store:
        grower = Grower(store)
        for size in sizes:
            log(f"growing to {size:,} spans ...")
            await grower.grow_to(size, log)
            log(f"measuring at {size:,} spans ({file_bytes(db) / 1024 / 1024:.0f} MB) ...")
            by_size[size] = await measure_size(store, grower, repeats)
        log("expiring everything under load ...")
        expire = await expire_under_load(store, grower, db)
    return {"sizes": list(sizes), "repeats": repeats, "medians_ms": by_size, "expire": expire}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"sizes {', '.join(map(str, QUICK_SIZES))}")
    parser.add_argument("--sizes", help="comma-separated span counts, ascending (overrides --quick)")
    parser.add_argument("--repeats", type=int, default=15, help="calls per operation and size (median)")
    parser.add_argument("--dir", type=Path, help="folder for the database (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(QUICK_SIZES if args.quick else SIZES)
    if sizes != sorted(sizes) or len(sizes) < 2:
        parser.error("--sizes needs at least two ascending span counts")
    if args.dir is not None and not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: not a folder")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="agl-growth-", dir=args.dir) as folder:
        results = asyncio.run(run(sizes, args.repeats, Path(folder), log))
    print(render(sizes, results["medians_ms"]))
    print()
    print(render_expire(sizes[-1], results["expire"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
