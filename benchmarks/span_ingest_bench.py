"""CPU per span of writing LLM-call spans to an embedded SQLite store: deltas on, off, and
(optionally) another checkout's store, such as the commit before deltas.

    .venv/bin/python benchmarks/span_ingest_bench.py
    .venv/bin/python benchmarks/span_ingest_bench.py --other /tmp/pre-deltas   # 9420c73, say by git archive

The spans: 100 attempts × 10 calls, each about 10 KB with about 450 token ids (a system
prompt, a growing conversation, the response body naming the prompt's ids again, as vLLM's
does), each prompt extending the previous call's context, so deltas happen. Each setting
writes the same 1,000 spans to a fresh store file, one `add_span` at a time (`single`) and
in `add_many_spans` batches of 50 calls of interleaved attempts (`batches`); CPU seconds
(all threads, `time.process_time`) per span, the median of `--repeats` rounds, the settings
alternated within each round so a load that comes and goes falls on all of them. Each
setting runs in its own process (`--other` imports that checkout's `agl_store`, with its
default settings).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ATTEMPTS, TURNS, BATCH = 100, 10, 50


def calls(rng: random.Random) -> list[list[dict[str, Any]]]:
    """Each attempt's call spans (as dicts), in turn order."""
    out = []
    for attempt in range(ATTEMPTS):
        prompt = [rng.randrange(50_000) for _ in range(200)]
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent. " * 160}]
        spans = []
        for turn in range(TURNS):
            messages.append({"role": "user", "content": f"tool result {turn} " * 40})
            response = [rng.randrange(50_000) for _ in range(20)]
            choices = [{"index": 0, "token_ids": response, "logprobs": [-0.25] * 20, "finish_reason": "stop"}]
            spans.append(
                {
                    "span_id": f"s{attempt}-{turn}",
                    "name": "agl.llm_call",
                    "attributes": {
                        "agl.request": {"model": "m", "messages": list(messages), "logprobs": True},
                        "agl.response": {
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * 30}}],
                            "prompt_token_ids": list(prompt),
                        },
                        "agl.prompt_token_ids": list(prompt),
                        "agl.choices": choices,
                    },
                }
            )
            messages.append({"role": "assistant", "content": "ok " * 30})
            prompt = prompt + response + [rng.randrange(50_000) for _ in range(5)]
        out.append(spans)
    return out


async def write(db: Path, deltas: bool | None, batched: bool) -> float:
    """CPU seconds per span of writing the spans to a new store at `db`."""
    from agl_store.models import Span
    from agl_store.sqlite import SQLiteStore

    kwargs = {} if deltas is None else {"deltas": deltas}
    async with SQLiteStore(str(db), **kwargs) as store:
        by_attempt = []
        for attempt in calls(random.Random(0)):
            rollout = await store.start_rollout(input={})
            rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
            by_attempt.append([Span(rollout_id=rid, attempt_id=aid, **span) for span in attempt])
        ordered = [attempt[turn] for turn in range(TURNS) for attempt in by_attempt]
        start = time.process_time()
        if batched:
            for i in range(0, len(ordered), BATCH):
                await store.add_many_spans(ordered[i : i + BATCH])
        else:
            for span in ordered:
                await store.add_span(span)
        return (time.process_time() - start) / len(ordered)


def child(args: argparse.Namespace) -> None:
    deltas = {"on": True, "off": False, "default": None}[args.child_deltas]
    with tempfile.TemporaryDirectory(prefix="agl-ingest-") as tmp:
        seconds = asyncio.run(write(Path(tmp) / "agl.db", deltas, args.child_batched))
    print(json.dumps(seconds))


def measure(code: Path, deltas: str, batched: bool) -> float:
    command = [sys.executable, __file__, "--child-deltas", deltas]
    command += ["--child-batched"] if batched else []
    env = {"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env, cwd=code).stdout
    return float(json.loads(out.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--other", type=Path, action="append", default=[], help="a checkout whose store is measured too (repeatable)"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child-deltas", help=argparse.SUPPRESS)
    parser.add_argument("--child-batched", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_deltas:
        child(args)
        return 0
    settings = [("deltas on", ROOT, "on"), ("deltas off", ROOT, "off")]
    settings += [(other.name, other.resolve(), "default") for other in args.other]
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, code, deltas in settings:
            for batched in (False, True):
                key = f"{name}, {'batches' if batched else 'single'}"
                times.setdefault(key, []).append(measure(code, deltas, batched))
    results = {key: statistics.median(values) for key, values in times.items()}
    print(f"CPU ms per span, {ATTEMPTS * TURNS} spans of ~10 KB, median of {args.repeats}")
    for key, seconds in results.items():
        print(f"{key:<40}{1000 * seconds:>8.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
