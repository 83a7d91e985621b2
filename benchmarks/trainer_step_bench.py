"""What agl adds to a training step outside the GPU work, for one step's batch of rollouts.

    .venv/bin/python benchmarks/trainer_step_bench.py            # 1,000 rollouts × 10 calls × ~8k tokens
    .venv/bin/python benchmarks/trainer_step_bench.py --quick    # 100 rollouts, 2 repeats
    .venv/bin/python benchmarks/trainer_step_bench.py --bodies   # calls with request and response bodies
    .venv/bin/python benchmarks/trainer_step_bench.py --json artifacts/trainer_step_bench.json

The rollouts are `aggregate_bench.py`'s tool agents (a context growing to `--tokens` over
`--turns` calls, logprobs, one rollout in eight breaking its prefix), written to
`agl store serve` on SQLite in its own process. Then, as the trainer does after each step's
rollouts (`step.read_succeeded` → `step.build_batch`), each a median of `--repeats`:

- `read (HTTP)`: every rollout's spans into `RolloutTrace`s through the trainer's store client,
  `LightningStoreClient(token_arrays=True)` (token ids packed on the wire and kept as int32
  arrays), 8 reads in flight (`read_succeeded`);
- `aggregate`: trajectory rows (`aggregate(..., "trajectory")`, agl's default limits 2048/8192);
- `tensorize`: rows → verl's `DataProto` (`to_data_proto`); the rows hold `array('i')` token
  ids, copied into the tensors as memory.

Baselines in the same run: `before: read (HTTP, lists, 1 at a time)`, `before: aggregate
(lists)` and `before: tensorize (rows of lists)`, how the trainer read, merged and tensorized
before (token ids as Python lists, one rollout after the other), and `read (in process,
lists)`: the `SQLiteStore` itself (the embedded store).

The store keeps LLM calls as deltas of earlier calls (docs/spans.md), and the trainer reads
them compactly (`query_spans(..., compact=True)`). In the same run, the same rollouts are also
written to a second server whose store keeps every span whole (`?deltas=off`, the storage
before deltas) and read the way the trainer read it then: `whole: read (HTTP)` and `whole:
aggregate`, with arrays and 8 reads in flight as above; `whole spans from deltas: read (HTTP)` is
a reader of whole spans on the deltas store (the server rebuilds each call). The summary line
compares read + aggregate, whole / compact, measured alternately within each repeat (the
`alternated` lines), as the two stores' other lines run at different moments; in wall seconds,
and in CPU seconds of the reading process and the server together (`CPU (client + server)`,
from `/proc`: on a shared machine the wall figures move by several times, the CPU ones least). The trainer
reads only the attributes it needs (`agl_train.core.traces.TRAINER_ATTRIBUTES`); `compact, all
attributes` is the compact read of every attribute, as the trainer read before (and `before:
read` reads that way too).

With `--bodies`, each call also carries the request and response bodies the proxy records
(the conversation as text, vLLM's answer with per-token logprobs and the prompt's ids again),
which the trainer's read leaves out; without, a call holds only what the trainer reads.

`agl total` = read (HTTP) + aggregate + tensorize, the trainer's own time per step (`before:
total` the same with the baselines). Beside it,
the baseline every step pays anyway: the rollouts' generation, stated (not measured here: no
GPU model runs in this benchmark) as the generated tokens of one rollout's sequential calls at
`--decode-tokens-per-s` per sequence (60 by default, a 7B model on one GPU with a full batch);
rollouts run in parallel, so one rollout's generation time is a lower bound of the step's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))
sys.path.insert(0, str(BENCH_DIR))

from aggregate_bench import rollout_spans, write_rollout  # noqa: E402
from store_bench import agl_server  # noqa: E402

from agl_store import Span, call_span  # noqa: E402
from agl_store.client import LightningStoreClient  # noqa: E402
from agl_store.sqlite import SQLiteStore  # noqa: E402
from agl_train.core.aggregate import Limits, aggregate  # noqa: E402
from agl_train.runner.groups import Group  # noqa: E402
from agl_train.verl_glue.step import read_succeeded  # noqa: E402
from agl_train.verl_glue.verl_batch import to_data_proto  # noqa: E402

LIMITS = Limits(max_prompt_length=2048, max_response_length=8192)
"""agl's default trajectory limits (`agentlightning.trace_aggregator` in agl_train/config.yaml)."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def with_bodies(spans: Sequence[Span]) -> list[Span]:
    """The calls with the request and response bodies the proxy records beside their ids
    (`agl.request`, `agl.response`): the conversation as text, about 4 characters a token,
    and vLLM's answer with per-token logprobs and the prompt's ids."""
    out: list[Span] = []
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent. " * 40}]
    seen = 0
    for span in spans:
        attributes = span.attributes
        if span.name != call_span.NAME:
            out.append(span)
            continue
        prompt = attributes[call_span.PROMPT_TOKEN_IDS]
        choice = attributes[call_span.CHOICES][0]
        messages.append({"role": "user", "content": "observation " * ((len(prompt) - seen) * 4 // 12)})
        answer = "answer " * (len(choice["token_ids"]) * 4 // 7)
        response = {
            "id": f"chatcmpl-{span.span_id}",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer},
                    "finish_reason": "stop",
                    "logprobs": {
                        "content": [
                            {"token": "tok", "logprob": lp, "bytes": [116, 111, 107], "top_logprobs": []}
                            for lp in choice["logprobs"]
                        ]
                    },
                    "token_ids": choice["token_ids"],
                }
            ],
            "prompt_token_ids": prompt,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(choice["token_ids"])},
        }
        request = {"model": "m", "messages": list(messages), "logprobs": True, "return_token_ids": True}
        out.append(
            span.model_copy(
                update={"attributes": {**attributes, call_span.REQUEST: request, call_span.RESPONSE: response}}
            )
        )
        messages.append({"role": "assistant", "content": answer})
        seen = len(prompt) + len(choice["token_ids"])
    return out


async def fill(store: Any, rollouts: int, turns: int, tokens: int, bodies: bool) -> list[Group]:
    """Write `rollouts` finished rollouts, one group of one rollout each, and return the groups."""
    rng = random.Random(0)
    groups: list[Group] = []
    for i in range(rollouts):
        spans = rollout_spans(f"r{i}", turns, tokens, breaks=i % 8 == 0, rng=rng)
        spans = with_bodies(spans) if bodies else spans
        rid, aid = await write_rollout(store, spans, {"task": i})
        await store.update_attempt(rid, aid, status="succeeded")
        groups.append(Group(uid=f"g{i}", input={"task": i}, rollout_ids=[rid], outcomes={rid: "succeeded"}))
        if (i + 1) % 100 == 0:
            log(f"  wrote {i + 1}/{rollouts} rollouts")
    return groups


async def timed(fn: Callable[[], Awaitable[Any]], repeats: int, *, warm_up: bool = False) -> tuple[float, Any]:
    """Median wall seconds of `await fn()` over `repeats` runs, and its last result. With
    `warm_up`, one untimed run first: each read path then finds the server's caches as a
    trainer does, which reads rollouts just written (else the first path measured pays them)."""
    times, result = [], None
    if warm_up:
        await fn()
    for _ in range(repeats):
        # The previous run's result goes first, as a trainer holds one step's batch at a time:
        # kept alive, two ~600 MB tensor batches coexist and the run pays for fresh pages.
        result = None
        start = time.perf_counter()
        result = await fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


class WholeSpans:
    """A store as the trainer read it before compact reads: every span whole, every attribute."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def get_latest_attempt(self, rollout_id: str) -> Any:
        return await self.store.get_latest_attempt(rollout_id)

    async def query_spans(self, *args: Any, compact: bool = False, attributes: Any = None, **kwargs: Any) -> Any:
        return await self.store.query_spans(*args, **kwargs)


class AllAttributes(WholeSpans):
    """A store as the trainer read it with compact reads of every attribute."""

    async def query_spans(self, *args: Any, attributes: Any = None, **kwargs: Any) -> Any:
        return await self.store.query_spans(*args, **kwargs)


async def measure_whole(url: str, groups: Sequence[Group], repeats: int, prefix: str) -> dict[str, float]:
    """Read + aggregate of whole spans, as the trainer did before compact reads."""
    stages: dict[str, float] = {}
    async with LightningStoreClient(url, retries=0, timeout=600.0, token_arrays=True) as client:
        stages[f"{prefix}read (HTTP)"], traces = await timed(
            lambda: read_succeeded(WholeSpans(client), groups, 0.0),  # type: ignore[arg-type]
            repeats,
            warm_up=True,
        )

    async def rows() -> Any:
        return aggregate(traces, "trajectory", LIMITS)

    if prefix == "whole: ":
        stages[f"{prefix}aggregate"], _ = await timed(rows, repeats)
    return stages


async def measure(url: str, db_path: Path, groups: Sequence[Group], repeats: int) -> dict[str, float]:
    """The trainer's path first, then the baselines (so its numbers see a heap without theirs)."""
    stages: dict[str, float] = {}
    async with LightningStoreClient(url, retries=0, timeout=600.0, token_arrays=True) as client:
        stages["read (HTTP)"], traces = await timed(lambda: read_succeeded(client, groups, 0.0), repeats, warm_up=True)

    async def rows() -> Any:
        return aggregate(traces, "trajectory", LIMITS)

    stages["aggregate"], aggregation = await timed(rows, repeats)

    async def tensors() -> Any:
        return to_data_proto(aggregation.rows, LIMITS, 0)

    stages["tensorize"], _ = await timed(tensors, repeats)
    stages["agl total"] = stages["read (HTTP)"] + stages["aggregate"] + stages["tensorize"]
    counts = {
        "_rows": float(len(aggregation.rows)),
        "_calls": float(sum(len(t.calls) for t in traces)),
        "_tokens": float(sum(len(c.prompt_ids) + len(c.response_ids) for t in traces for c in t.calls)),
    }
    traces, aggregation = [], None  # let the batch go before the baselines run

    async with LightningStoreClient(url, retries=0, timeout=600.0) as client:
        stages["before: read (HTTP, lists, 1 at a time)"], as_lists = await timed(
            lambda: read_succeeded(AllAttributes(client), groups, 0.0, in_flight=1),  # type: ignore[arg-type]
            repeats,
        )

    async def rows_of_lists() -> Any:
        return aggregate(as_lists, "trajectory", LIMITS)

    stages["before: aggregate (lists)"], list_rows = await timed(rows_of_lists, repeats)
    as_lists = []

    async def tensors_of_lists() -> Any:
        return to_data_proto(list_rows.rows, LIMITS, 0)

    stages["before: tensorize (rows of lists)"], _ = await timed(tensors_of_lists, repeats)
    list_rows = None
    stages["before: total"] = (
        stages["before: read (HTTP, lists, 1 at a time)"]
        + stages["before: aggregate (lists)"]
        + stages["before: tensorize (rows of lists)"]
    )
    local = await SQLiteStore(str(db_path)).open()
    try:
        stages["read (in process, lists)"], _ = await timed(lambda: read_succeeded(local, groups, 0.0), repeats)
    finally:
        await local.close()
    return {**stages, **counts}


READS = {"whole": WholeSpans, "compact, all attributes": AllAttributes, "compact": lambda client: client}
"""How the trainer read a rollout: before deltas, with compact reads of every attribute, today."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far (Linux `/proc`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def read_and_aggregate(url: str, server_pid: int, groups: Sequence[Group], how: str) -> tuple[float, float]:
    """Seconds to read `groups` (`READS[how]`) and build their trajectory rows: wall, and the
    CPU of this process and of the server (`server_pid`) together."""
    async with LightningStoreClient(url, retries=0, timeout=600.0, token_arrays=True) as client:
        store: Any = READS[how](client)
        start, cpu = time.perf_counter(), time.process_time() + cpu_seconds(server_pid)
        traces = await read_succeeded(store, groups, 0.0)
        aggregate(traces, "trajectory", LIMITS)
        return time.perf_counter() - start, time.process_time() + cpu_seconds(server_pid) - cpu


async def compare(
    servers: tuple[tuple[str, int], tuple[str, int]], groups: tuple[Sequence[Group], Sequence[Group]], repeats: int
) -> dict[str, float]:
    """Read + aggregate of whole spans (the store without deltas) and of compact spans (the
    store with deltas; every attribute, and the trainer's own), alternated within each repeat
    after one untimed round, so that a load that comes and goes on a shared machine falls on all.
    Wall seconds and CPU seconds (client + server): on a shared machine the CPU moves less."""
    times: dict[str, list[tuple[float, float]]] = {how: [] for how in READS}
    for repeat in range(repeats + 1):
        for how in READS:
            (url, pid), group = (servers[0], groups[0]) if how == "whole" else (servers[1], groups[1])
            seconds = await read_and_aggregate(url, pid, group, how)
            if repeat:
                times[how].append(seconds)
    wall = {f"{how}: read + aggregate, alternated": statistics.median(t[0] for t in times[how]) for how in READS}
    cpu = {f"{how}: CPU (client + server), alternated": statistics.median(t[1] for t in times[how]) for how in READS}
    return {**wall, **cpu}


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    whole_db, db_path = workdir / "whole.db", workdir / "agl.db"
    with (
        agl_server(f"sqlite:///{whole_db}?deltas=off", workdir / "whole-server.log") as (whole_url, whole_pid),  # type: ignore[arg-type]
        agl_server(db_path, workdir / "server.log") as (url, pid),
    ):
        async with LightningStoreClient(whole_url, retries=0, timeout=600.0) as client:
            log(f"writing {args.rollouts} rollouts × {args.turns} calls × ~{args.tokens} tokens to {whole_url} (whole)")
            whole_groups = await fill(client, args.rollouts, args.turns, args.tokens, args.bodies)
        async with LightningStoreClient(url, retries=0, timeout=600.0) as client:
            log(f"writing {args.rollouts} rollouts × {args.turns} calls × ~{args.tokens} tokens to {url}")
            groups = await fill(client, args.rollouts, args.turns, args.tokens, args.bodies)
        log(f"measuring (median of {args.repeats})")
        stages = await measure(url, db_path, groups, args.repeats)
        stages.update(await measure_whole(url, groups, args.repeats, "whole spans from deltas: "))
        stages.update(await measure_whole(whole_url, whole_groups, args.repeats, "whole: "))
        stages.update(await compare(((whole_url, whole_pid), (url, pid)), (whole_groups, groups), args.repeats))
    stages["_whole_db_bytes"] = float(whole_db.stat().st_size)
    stages["_deltas_db_bytes"] = float(db_path.stat().st_size)
    return stages


def generated_tokens(turns: int, tokens: int) -> int:
    """The tokens one rollout's calls generate (the workload's answers)."""
    spans = rollout_spans("r", turns, tokens, False, random.Random(0))
    return sum(len(span.attributes[call_span.CHOICES][0]["token_ids"]) for span in spans if span.name == call_span.NAME)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-tokens-per-s", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="100 rollouts, 2 repeats")
    parser.add_argument(
        "--bodies", action="store_true", help="calls carry request and response bodies, as the proxy records them"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rollouts, args.repeats = 100, 2

    with tempfile.TemporaryDirectory(prefix="agl-trainer-bench-") as tmp:
        stages = asyncio.run(run(args, Path(tmp)))
    rows, calls, tokens, whole_bytes, deltas_bytes = (
        int(stages.pop(key)) for key in ("_rows", "_calls", "_tokens", "_whole_db_bytes", "_deltas_db_bytes")
    )
    generated = generated_tokens(args.turns, args.tokens)
    rollout_s = generated / args.decode_tokens_per_s
    results = {
        "workload": {
            "rollouts": args.rollouts,
            "turns": args.turns,
            "tokens_per_rollout": args.tokens,
            "bodies": args.bodies,
            "llm_calls": calls,
            "tokens_read": tokens,
            "trajectory_rows": rows,
            "repeats": args.repeats,
            "python": platform.python_version(),
        },
        "stages_s": stages,
        "baseline": {
            "generated_tokens_per_rollout": generated,
            "decode_tokens_per_s": args.decode_tokens_per_s,
            "rollout_generation_s": rollout_s,
        },
    }
    print(
        f"{args.rollouts} rollouts × {args.turns} calls × ~{args.tokens} tokens: {calls} LLM calls, "
        f"{tokens / 1e6:.1f}M token ids read, {rows} trajectory rows (median of {args.repeats})"
    )
    print(f"{'stage':<42}{'seconds':>10}{'per rollout ms':>16}")
    for name, seconds in stages.items():
        print(f"{name:<42}{seconds:>10.3f}{1000 * seconds / args.rollouts:>16.2f}")
    total = stages["agl total"]
    print(
        f"baseline: one rollout's generation ≥ {rollout_s:.1f} s ({generated} tokens at "
        f"{args.decode_tokens_per_s:.0f} tokens/s); agl total / generation = {total / rollout_s:.3f}; "
        f"before / now = {stages['before: total'] / total:.2f}; "
        f"target agl total < 2 s for 1,000 rollouts: {'ok' if total < 2 * args.rollouts / 1000 else 'MISS'}"
    )
    compact = stages["compact: read + aggregate, alternated"]
    every = stages["compact, all attributes: read + aggregate, alternated"]
    before = stages["whole: read + aggregate, alternated"]
    print(
        f"read + aggregate: whole spans {before:.3f} s, compact (all attributes) {every:.3f} s, compact "
        f"(the trainer's attributes) {compact:.3f} s, whole / compact = {before / compact:.2f}; "
        f"database {whole_bytes / 1e6:.1f} MB whole, {deltas_bytes / 1e6:.1f} MB with deltas"
    )
    compact_cpu = stages["compact: CPU (client + server), alternated"]
    before_cpu = stages["whole: CPU (client + server), alternated"]
    print(
        f"CPU of read + aggregate (client + server): whole spans {before_cpu:.3f} s, compact (the trainer's "
        f"attributes) {compact_cpu:.3f} s, whole / compact = {before_cpu / compact_cpu:.2f}"
    )
    results["database_bytes"] = {"whole": whole_bytes, "deltas": deltas_bytes}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
