"""agl's store measured side by side with agent-lightning 0.3's, in one run.

    .venv/bin/python benchmarks/store_bench.py            # full run, 10-20 minutes (mostly the peer)
    .venv/bin/python benchmarks/store_bench.py --quick    # smoke run, 2-3 minutes
    .venv/bin/python benchmarks/store_bench.py --no-peer --json artifacts/store_bench.json

Both stores run the same scenarios (`_workload.py`) on the same spans (LLM calls shaped
like docs/spans.md, ~10 KB each): in process (agl: SQLite file; agent-lightning 0.3: its
in-memory store, it has no SQLite backend) and over HTTP, the server in its own process
(agl: `agl store serve` on SQLite; 0.3: its `agl store`) and the load generator here,
using each project's own `LightningStoreClient`. Each scenario runs `repeats` times on
2 noisy cores; the table quotes medians. The peer runs in its own venv
(`.cache/peers/agentlightning-0.3`, made on first use; see `_peers.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(1, str(BENCH_DIR.parent))

import _peers  # noqa: E402
import _workload as wl  # noqa: E402
from _serving import served  # noqa: E402

from agl_store.models import EnqueueRolloutRequest, Span  # noqa: E402

SERVER_START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Metric:
    """One line of the table: where its number is in the results and what it should reach."""

    key: str
    label: str
    unit: str
    higher_is_better: bool = True
    target: float | None = None
    field: str = "rate"
    """Which of the scenario's numbers (`rate`, `median`, `p90`) the line shows."""

    def value(self, results: dict[str, Any], field: str | None = None) -> float | None:
        entry = results.get(self.key)
        return None if entry is None else entry["value"].get(field or self.field)

    def meets(self, value: float) -> bool:
        assert self.target is not None
        return value >= self.target if self.higher_is_better else value <= self.target


def metrics(batch_size: int) -> list[Metric]:
    lines: list[Metric] = []
    for transport, where in (("inproc", "in-process"), ("http", "HTTP")):
        http = transport == "http"
        lines += [
            Metric(f"{transport}.add_span_c1", f"add_span, {where}, c=1", "spans/s", target=1500 if http else None),
            Metric(f"{transport}.add_span_c16", f"add_span, {where}, c=16", "spans/s", target=1500 if http else None),
            Metric(
                f"{transport}.add_many_c1",
                f"add_many_spans x{batch_size}, {where}, c=1",
                "spans/s",
                target=10_000 if http else None,
            ),
            Metric(
                f"{transport}.add_many_c16",
                f"add_many_spans x{batch_size}, {where}, c=16",
                "spans/s",
                target=10_000 if http else None,
            ),
            Metric(
                f"{transport}.query_spans_ms",
                f"query_spans 100 spans, {where}, median",
                "ms",
                higher_is_better=False,
                target=5.0 if http else None,
                field="median",
            ),
            Metric(
                f"{transport}.query_spans_ms",
                f"query_spans 100 spans, {where}, p90",
                "ms",
                higher_is_better=False,
                field="p90",
            ),
            Metric(f"{transport}.queue_cycles", f"enqueue>dequeue>succeed, {where}", "cycles/s"),
        ]
    lines.append(Metric("http.runners", "100 runners: dequeue+6 spans+succeed, HTTP", "rollouts/s", target=300))
    return lines


# --- agl's side ------------------------------------------------------------------------


class AglKit:
    """agl spans take the docs/spans.md attributes as they are (native JSON)."""

    def span(self, fields: dict[str, Any]) -> Any:
        return Span(**fields)

    def enqueue_request(self, input: Any) -> Any:
        return EnqueueRolloutRequest(input=input)


def sqlite_store_factory(db_path: Path) -> Callable[[], Any]:
    """Opens the SQLite store on `db_path` for the length of an `async with`."""
    from agl_store.opening import open_store

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[Any]:
        store = await open_store(f"sqlite:///{db_path}")
        try:
            yield store
        finally:
            await store.close()

    return factory


def http_client_factory(url: str) -> Callable[[], Any]:
    """Opens a new `LightningStoreClient` of the server at `url` for an `async with`."""
    from agl_store.client import LightningStoreClient

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[Any]:
        # No retries: a failing request should fail the run, not hide inside its time.
        async with LightningStoreClient(url, retries=0) as store:
            yield store

    return factory


def agl_server(db_path: Path, log_path: Path) -> Any:
    """`agl store serve` on SQLite at a free 127.0.0.1 port, in its own process; a context
    manager yielding (url, pid), the pid being what a profiler attaches to."""
    return served(
        lambda port: [
            sys.executable,
            "-m",
            "agl_store.cli",
            "store",
            "serve",
            "--db",
            str(db_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        SERVER_START_TIMEOUT_S,
        log_path,
        cwd=BENCH_DIR.parent,  # `-m agl_store.cli` resolves in the repository, installed or not
    )


@contextlib.contextmanager
def py_spy(pid: int, out: Path | None, log: Callable[[str], None]) -> Iterator[None]:
    """Sample process `pid` with py-spy while the block runs (nothing when `out` is None).

    The format follows the suffix: `.txt` collapsed stacks (greppable), `.json`
    speedscope, anything else an SVG flame graph.
    """
    if out is None:
        yield
        return
    fmt = {".txt": "raw", ".json": "speedscope"}.get(out.suffix, "flamegraph")
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    proc = subprocess.Popen(
        [
            str(spy),
            "record",
            "--pid",
            str(pid),
            "--format",
            fmt,
            "--output",
            str(out),
            "--rate",
            "200",
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield
    finally:
        # SIGINT is py-spy's "stop and write the profile".
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        log(f"py-spy of the server ({fmt}) -> {out}" if out.exists() else f"py-spy failed: {err.decode()[-500:]}")


async def run_agl(
    counts: wl.Counts,
    transports: list[str],
    only: list[str] | None,
    workdir: Path,
    log: Callable[[str], None],
    profile_server: Path | None = None,
) -> dict[str, Any]:
    """The scenarios (all, or those named in `only`) against agl's store; results keyed
    like the peer worker's."""
    kit = AglKit()
    payloads = wl.payload_pool()
    results: dict[str, Any] = {}
    if "inproc" in transports:
        for name, scenario in wl.select(wl.span_scenarios(), only).items():
            connect = sqlite_store_factory(workdir / f"inproc-{name}.db")
            bench = wl.Bench(kit=kit, payloads=payloads, counts=counts, connect=connect)
            results.update(await wl.measure_all("inproc", {name: scenario}, bench, log))
    if "http" in transports:
        with agl_server(workdir / "http.db", workdir / "server.log") as (url, pid), py_spy(pid, profile_server, log):
            bench = wl.Bench(
                kit=kit, payloads=payloads, counts=counts, connect=http_client_factory(url), server_pid=pid
            )
            results.update(await wl.measure_all("http", wl.select(wl.http_scenarios(), only), bench, log))
    return results


# --- report ----------------------------------------------------------------------------


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"


def render_table(lines: list[Metric], agl: dict[str, Any], peer: dict[str, Any]) -> str:
    """The comparison as a fixed-width table; ratio is agl/peer (>1 is better for rates,
    <1 for latencies). The `cpu ms/op` columns are CPU milliseconds per operation of the
    load generator (client; the whole store when in process) and of the HTTP server."""
    header = (
        "metric",
        "unit",
        "agl",
        "peer 0.3",
        "agl/peer",
        "target",
        "cpu ms/op agl: load",
        "server",
        "peer: load",
        "server",
    )
    rows = [header]
    for metric in lines:
        ours, theirs = metric.value(agl), metric.value(peer)
        ratio = f"{ours / theirs:.2f}x" if ours is not None and theirs else "-"
        target = "-"
        if metric.target is not None:
            sign = ">=" if metric.higher_is_better else "<"
            verdict = "" if ours is None else (" ok" if metric.meets(ours) else " MISS")
            target = f"{sign}{_num(metric.target)}{verdict}"
        cpu = [metric.value(side, f) for side in (agl, peer) for f in ("load_ms_per_op", "server_ms_per_op")]
        cpu_cells = ["-" if c is None or metric.field == "p90" else f"{c:.2f}" for c in cpu]
        rows.append((metric.label, metric.unit, _num(ours), _num(theirs), ratio, target, *cpu_cells))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    out = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])] + [
            c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=False)
        ]
        out.append("  ".join(cells))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def measure_peer(args: argparse.Namespace, counts: wl.Counts, log: Callable[[str], None]) -> tuple[dict[str, Any], str]:
    """The peer's results (empty when it cannot run) and a line saying what ran or why not."""
    if args.no_peer:
        return {}, "skipped (--no-peer)"
    peer = _peers.ensure_peer(args.peer_cache, log)
    if isinstance(peer, _peers.PeerUnavailable):
        log(f"peer: skipped: {peer.reason}")
        return {}, f"skipped: {peer.reason}"
    log(f"peer: measuring agentlightning {peer.version}")
    worker_args = ["--counts", json.dumps(asdict(counts)), "--transports", args.transports, "--only", args.only or ""]
    try:
        return _peers.run_peer_worker(peer, worker_args, log), f"agentlightning {peer.version}"
    except RuntimeError as exc:
        log(f"peer: failed: {exc}")
        return {}, f"failed: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts, one run each: a smoke run")
    parser.add_argument("--no-peer", action="store_true", help="measure agl only")
    parser.add_argument("--repeats", type=int, help="runs per scenario (default 3, --quick 1)")
    parser.add_argument("--transports", default="inproc,http", help="comma list of: inproc, http")
    parser.add_argument("--only", help="comma list of scenarios to run, e.g. add_many_c1,runners (default: all)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--profile-server", type=Path, help="py-spy the agl HTTP server into this file (.txt/.json/.svg)"
    )
    parser.add_argument("--peer-cache", type=Path, default=_peers.DEFAULT_CACHE_DIR, help="where the peer venv lives")
    args = parser.parse_args(argv)

    counts = wl.Counts.quick() if args.quick else wl.Counts()
    if args.repeats:
        counts = wl.Counts(**{**asdict(counts), "repeats": args.repeats})
    transports = [t for t in args.transports.split(",") if t]
    if not transports or set(transports) - {"inproc", "http"}:
        parser.error(f"--transports takes inproc and/or http, got {args.transports!r}")
    only = [name for name in args.only.split(",") if name] if args.only else None
    try:
        wl.select(wl.http_scenarios(), only)
    except ValueError as exc:
        parser.error(str(exc))

    def log(message: str) -> None:
        print(message, flush=True)

    payload_bytes = wl.payload_bytes(wl.payload_pool()[0])
    log(
        f"store_bench: {os.cpu_count()} CPUs, Python {platform.python_version()}, span payload {payload_bytes:,} B, "
        f"{counts.repeats} run(s) per scenario"
    )
    log("agl: measuring")
    with tempfile.TemporaryDirectory(prefix="agl-store-bench-") as tmp:
        agl_results = asyncio.run(
            run_agl(counts, transports, only, Path(tmp), lambda m: log(f"  agl: {m}"), args.profile_server)
        )
    peer_results, peer_note = measure_peer(args, counts, log)

    lines = [m for m in metrics(counts.batch_size) if m.key in agl_results or m.key in peer_results]
    print()
    print(render_table(lines, agl_results, peer_results))
    print(
        f"\npeer: {peer_note}. Medians of {counts.repeats} run(s). agl/peer above 1 is better for rates, "
        "below 1 for ms.\nIn process: agl = SQLite file, peer = its in-memory store. HTTP: server in its own process."
    )

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "command": " ".join([Path(sys.executable).name, *sys.argv]),
                    "counts": asdict(counts),
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "span_payload_bytes": payload_bytes,
                    "agl": agl_results,
                    "peer": peer_results,
                    "peer_note": peer_note,
                },
                indent=2,
            )
        )
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
