"""agl_train's span → row path measured on realistic agent rollouts, beside baselines, in one run.

    .venv/bin/python benchmarks/aggregate_bench.py             # 64 rollouts × 10 turns × ~8k tokens
    .venv/bin/python benchmarks/aggregate_bench.py --quick     # a smoke run
    .venv/bin/python benchmarks/aggregate_bench.py --json artifacts/aggregate_bench.json

Each rollout is a tool agent of `--turns` calls whose context grows to about `--tokens`
tokens: a long initial prompt, then per turn a generated answer and a tool observation,
with logprobs, as `docs/spans.md` spans. One rollout in eight re-renders its history at
turn 6 (the prefix breaks), as agents with a lossy chat template do. Stages, each timed
on the same spans (median of `--repeats`):

- `parse`: spans → LLM calls and reward (`agl_train.core.traces.trace_from_spans`);
- `trajectory`: calls → merged rows (`aggregate(..., "trajectory")`);
- baseline `naive merge`: the same merge written the obvious way, copying the whole
  context per call and comparing it by slicing (how agent-lightning 0.3's daemon does it);
- baseline `transition`: one row per call, no merging at all;
- `tensorize`: rows → the padded verl tensors (`rows_to_tensors`);
- `store read`: `read_rollout` from a `SQLiteStore(":memory:")` holding the spans
  (token ids packed by the store), i.e. what the trainer pays per step.

Rates: spans/s (LLM-call spans in) and rows/s (rows out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agl_store.models import Span, reward_span
from agl_train.algo.tensorize import rows_to_tensors
from agl_train.core.aggregate import Limits, aggregate
from agl_train.core.traces import RolloutTrace, read_rollout, trace_from_spans

VOCAB = 150_000


def rollout_spans(rollout_id: str, turns: int, tokens: int, breaks: bool, rng: random.Random) -> list[Span]:
    """Spans of one tool-agent rollout whose context reaches about `tokens` tokens."""
    initial = tokens // 8
    per_turn = (tokens - initial) // turns
    answer, observation = per_turn * 2 // 5, per_turn - per_turn * 2 // 5
    context = [rng.randrange(VOCAB) for _ in range(initial)]
    spans: list[Span] = []
    for turn in range(turns):
        if breaks and turn == turns // 2 + 1:
            context = context[:initial] + [rng.randrange(VOCAB)] + context[initial + 1 :]  # re-rendered history
        response = [rng.randrange(VOCAB) for _ in range(answer)]
        spans.append(
            Span(
                rollout_id=rollout_id,
                attempt_id="at-1",
                sequence_id=turn + 1,
                name="agl.llm_call",
                status={"status_code": "OK"},
                attributes={
                    "agl.prompt_token_ids": list(context),
                    "agl.choices": [
                        {"index": 0, "token_ids": response, "logprobs": [-0.5] * answer, "finish_reason": "stop"}
                    ],
                },
            )
        )
        context = context + response + [rng.randrange(VOCAB) for _ in range(observation)]
    spans.append(reward_span(rollout_id, "at-1", rng.random(), sequence_id=turns + 1))
    return spans


def naive_merge(trace: RolloutTrace) -> list[tuple[list[int], list[int], list[int]]]:
    """Baseline: the merge written the obvious way, a fresh context list per call."""
    rows: list[tuple[list[int], list[int], list[int]]] = []
    context: list[int] = []
    prompt: list[int] = []
    response: list[int] = []
    mask: list[int] = []
    for call in trace.calls:
        full = call.prompt_ids + call.response_ids
        if context and full[: len(context)] == context:
            inserted = call.prompt_ids[len(prompt) + len(response) :]
            response = response + inserted + call.response_ids
            mask = mask + [0] * len(inserted) + [1] * len(call.response_ids)
        else:
            if context:
                rows.append((prompt, response, mask))
            prompt, response, mask = list(call.prompt_ids), list(call.response_ids), [1] * len(call.response_ids)
        context = full
    if context:
        rows.append((prompt, response, mask))
    return rows


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall seconds of `fn` over `repeats` runs, and its last result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


async def write_rollout(store: Any, spans: Sequence[Span], input: Any) -> tuple[str, str]:
    """Start a rollout and store `spans` under its attempt (numbered by the store); (rollout id, attempt id)."""
    rollout = await store.start_rollout(input=input)
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
    await store.add_many_spans(
        [s.model_copy(update={"rollout_id": rid, "attempt_id": aid, "sequence_id": None}) for s in spans]
    )
    return rid, aid


async def store_read(all_spans: Sequence[list[Span]], repeats: int) -> float:
    from agl_store.sqlite import SQLiteStore

    store = SQLiteStore(":memory:")
    await store.open()
    try:
        ids = []
        for spans in all_spans:
            rid, _ = await write_rollout(store, spans, {})
            ids.append(rid)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for rid in ids:
                await read_rollout(store, rid)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        await store.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="8 rollouts, 2 repeats")
    parser.add_argument("--no-store", action="store_true", help="skip the SQLite read stage")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rollouts, args.repeats = 8, 2

    rng = random.Random(0)
    all_spans = [
        rollout_spans(f"ro-{i}", args.turns, args.tokens, breaks=i % 8 == 0, rng=rng) for i in range(args.rollouts)
    ]
    n_spans = args.rollouts * args.turns
    limits = Limits(max_prompt_length=args.tokens, max_response_length=args.tokens)

    parse_s, traces = timed(lambda: [trace_from_spans(s[0].rollout_id, s) for s in all_spans], args.repeats)
    trajectory_s, merged = timed(lambda: aggregate(traces, "trajectory", limits), args.repeats)
    naive_s, naive_rows = timed(lambda: [r for t in traces for r in naive_merge(t)], args.repeats)
    transition_s, transitions = timed(lambda: aggregate(traces, "transition", limits), args.repeats)
    tensorize_s, _ = timed(lambda: rows_to_tensors(merged.rows, limits, 0), args.repeats)
    assert [(r.prompt_ids, r.response_ids, r.response_mask) for r in merged.rows] == naive_rows
    store_s = None if args.no_store else asyncio.run(store_read(all_spans, args.repeats))

    n_rows = len(merged.rows)
    results: dict[str, Any] = {
        "workload": {
            "rollouts": args.rollouts,
            "turns": args.turns,
            "tokens_per_rollout": args.tokens,
            "llm_call_spans": n_spans,
            "trajectory_rows": n_rows,
            "transition_rows": len(transitions.rows),
            "repeats": args.repeats,
            "python": platform.python_version(),
        },
        "stages": {
            "parse": {"seconds": parse_s, "spans_per_s": n_spans / parse_s},
            "trajectory": {
                "seconds": trajectory_s,
                "spans_per_s": n_spans / trajectory_s,
                "rows_per_s": n_rows / trajectory_s,
            },
            "baseline_naive_merge": {
                "seconds": naive_s,
                "spans_per_s": n_spans / naive_s,
                "rows_per_s": n_rows / naive_s,
            },
            "baseline_transition": {
                "seconds": transition_s,
                "spans_per_s": n_spans / transition_s,
                "rows_per_s": len(transitions.rows) / transition_s,
            },
            "tensorize": {"seconds": tensorize_s, "rows_per_s": n_rows / tensorize_s},
        },
    }
    if store_s is not None:
        results["stages"]["store_read"] = {"seconds": store_s, "spans_per_s": n_spans / store_s}

    w = results["workload"]
    print(
        f"{w['rollouts']} rollouts × {w['turns']} turns × ~{w['tokens_per_rollout']} tokens: "
        f"{w['llm_call_spans']} LLM-call spans → {w['trajectory_rows']} trajectory rows (median of {w['repeats']})"
    )
    print(f"{'stage':<24}{'seconds':>10}{'spans/s':>12}{'rows/s':>12}")
    for name, stage in results["stages"].items():
        spans_rate = f"{stage['spans_per_s']:.0f}" if "spans_per_s" in stage else "-"
        rows_rate = f"{stage['rows_per_s']:.0f}" if "rows_per_s" in stage else "-"
        print(f"{name:<24}{stage['seconds']:>10.4f}{spans_rate:>12}{rows_rate:>12}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
