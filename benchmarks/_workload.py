"""The store benchmark's workload: realistic LLM-call spans and the timed scenarios.

One implementation runs against both stores, so the numbers compare like with like:
`store_bench.py` drives agl's stores with it, `_peer_worker.py` drives agent-lightning
0.3's from the peer's own interpreter. Hence stdlib only, and the two stores differ only
through a `StoreKit` (how to build a span and an enqueue request from plain dicts).

Every loop is bounded by a count, never by a clock; a scenario returns a few numbers per
run (a rate or latencies, and the server's CPU per operation when it is served).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

SPANS_PER_ROLLOUT = 100
"""The rollout size of the span scenarios and of the `query_spans` scenario."""
SPANS_PER_RUNNER_ROLLOUT = 6
"""LLM calls per rollout in the runner scenario (a short multi-turn agent)."""
PAYLOAD_VARIANTS = 16
"""Distinct span payloads, reused round-robin: enough to defeat any caching, cheap to build."""

_WORDS = (
    "the agent calls a tool to read the file then answers with a short summary of what it found "
    "model token reward rollout attempt store span proxy trainer policy gradient advantage value "
    "search result page python error retry timeout json schema field value list number question"
).split()


class StoreKit(Protocol):
    """What differs between the two stores' client libraries."""

    def span(self, fields: dict[str, Any]) -> Any:
        """A span object of this library from docs/spans.md-shaped plain fields."""

    def enqueue_request(self, input: Any) -> Any:
        """An `EnqueueRolloutRequest` of this library for `input`."""


@dataclass(frozen=True)
class Counts:
    """How much work one run of each scenario does (identical for agl and the peer)."""

    single_spans: int = 600
    single_spans_c16: int = 1200
    batch_spans: int = 2000
    batch_spans_c16: int = 2000
    batch_size: int = 100
    queries: int = 100
    cycles: int = 300
    runner_rollouts: int = 300
    runners: int = 100
    repeats: int = 3

    @classmethod
    def quick(cls) -> Counts:
        """A smoke run: seconds, not minutes; numbers are indicative only."""
        return cls(
            single_spans=100,
            single_spans_c16=160,
            batch_spans=400,
            batch_spans_c16=800,
            queries=30,
            cycles=50,
            runner_rollouts=100,
            runners=100,
            repeats=1,
        )


# --- the span of an LLM call (docs/spans.md) ------------------------------------------


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def llm_call_payload(seed: int) -> dict[str, Any]:
    """Attributes of one `agl.llm_call` span: ~10 KB of JSON, 450 distinct token ids.

    Shaped like a vLLM chat completion through the proxy: the request with its messages,
    the response as vLLM returns it (`prompt_token_ids`, per-choice `token_ids`), and the
    token ids again as `agl.*` attributes, as docs/spans.md asks. No logprobs (not requested).
    """
    rng = random.Random(seed)
    prompt_ids = [rng.randrange(151_000) for _ in range(300)]
    output_ids = [rng.randrange(151_000) for _ in range(150)]
    model = "Qwen/Qwen2.5-0.5B-Instruct"
    request = {
        "model": model,
        "messages": [
            {"role": "system", "content": _text(rng, 60)},
            {"role": "user", "content": _text(rng, 120)},
            {"role": "assistant", "content": _text(rng, 40)},
            {"role": "tool", "tool_call_id": "call_0", "content": _text(rng, 60)},
        ],
        "temperature": 0.7,
        "max_tokens": 512,
        "logprobs": False,
        "return_token_ids": True,
    }
    content = _text(rng, 100)
    response = {
        "id": f"chatcmpl-{rng.getrandbits(64):016x}",
        "object": "chat.completion",
        "created": 1_764_000_000 + seed,
        "model": model,
        "prompt_token_ids": prompt_ids,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "tool_calls": []},
                "finish_reason": "stop",
                "token_ids": output_ids,
            }
        ],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(output_ids), "total_tokens": 450},
    }
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "vllm",
        "gen_ai.request.model": model,
        "gen_ai.response.model": model,
        "gen_ai.usage.input_tokens": len(prompt_ids),
        "gen_ai.usage.output_tokens": len(output_ids),
        "agl.request": request,
        "agl.response": response,
        "agl.prompt_token_ids": prompt_ids,
        "agl.choices": [{"index": 0, "token_ids": output_ids, "logprobs": None, "finish_reason": "stop"}],
        "agl.stream": False,
        "agl.backend": "http://127.0.0.1:8000/v1",
        "agl.model_version": "v3",
        "agl.latency_s": 0.8 + rng.random(),
        "agl.ttft_s": 0.8,
        "agl.error": None,
    }


def payload_pool() -> list[dict[str, Any]]:
    return [llm_call_payload(seed) for seed in range(PAYLOAD_VARIANTS)]


def span_fields(payload: dict[str, Any], rollout_id: str, attempt_id: str, sequence_id: int) -> dict[str, Any]:
    """Every field of a span, explicit, so that both libraries validate the same input."""
    rng = random.Random(f"{rollout_id}/{attempt_id}/{sequence_id}")
    trace_id = f"{rng.getrandbits(128):032x}"
    span_id = f"{rng.getrandbits(64):016x}"
    start = 1_764_000_000.0 + sequence_id
    return {
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "sequence_id": sequence_id,
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_id": None,
        "name": "agl.llm_call",
        "status": {"status_code": "OK", "description": None},
        "attributes": payload,
        "events": [],
        "links": [],
        "start_time": start,
        "end_time": start + payload["agl.latency_s"],
        "context": {"trace_id": trace_id, "span_id": span_id, "is_remote": False, "trace_state": {}},
        "parent": None,
        "resource": {"attributes": {"service.name": "agl-proxy"}, "schema_url": ""},
    }


def otel_flat(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attributes as OpenTelemetry allows them (agent-lightning 0.3's `Span` does):
    objects become JSON strings, nulls are left out, int and float arrays stay arrays."""
    flat: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)):
            flat[key] = json.dumps(value)
        else:
            flat[key] = value
    return flat


def payload_bytes(payload: dict[str, Any]) -> int:
    return len(json.dumps(payload).encode())


# --- measuring ------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation, as numpy's default does."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds process `pid` has used (Linux /proc), or None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Bench:
    """Everything a scenario needs besides the store handle it is given."""

    kit: StoreKit
    payloads: list[dict[str, Any]]
    counts: Counts
    connect: Callable[[], AbstractAsyncContextManager[Any]]
    """Opens another handle on the same store (a separate client, as another runner has)."""
    server_pid: int | None = None
    """The HTTP server's process, whose CPU time is charged to each timed section."""


class _Clock:
    """Wall time of a timed section and the CPU it cost, here and in the server.

    CPU per operation is the noise-robust number on a shared machine: the wall-clock rate
    moves with whatever else runs, CPU seconds per operation much less. `load_ms_per_op`
    is this process (the load generator and client; the whole store when in process),
    `server_ms_per_op` the HTTP server's process.
    """

    def __init__(self, bench: Bench) -> None:
        self._pid = bench.server_pid
        self._server0 = self._server_cpu()
        self._load0 = time.process_time()
        self._t0 = time.perf_counter()

    def _server_cpu(self) -> float | None:
        return process_cpu_seconds(self._pid) if self._pid is not None else None

    def result(self, ops: int) -> dict[str, float]:
        """{"rate": ops/s, "load_ms_per_op": ..., "server_ms_per_op": ... (served only)}."""
        elapsed = time.perf_counter() - self._t0
        out = {"rate": ops / elapsed, "load_ms_per_op": (time.process_time() - self._load0) * 1000.0 / ops}
        server1 = self._server_cpu()
        if self._server0 is not None and server1 is not None:
            out["server_ms_per_op"] = (server1 - self._server0) * 1000.0 / ops
        return out


async def pool(items: Iterable[Any], concurrency: int, fn: Callable[[Any], Awaitable[Any]]) -> None:
    """Run `fn` over `items` with at most `concurrency` calls in flight."""
    it = iter(items)

    async def worker() -> None:
        # Tasks share one iterator: asyncio is single-threaded, so each item goes out once.
        for item in it:
            await fn(item)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _span_groups(store: Any, bench: Bench, n_spans: int) -> list[list[Any]]:
    """Span objects for `n_spans` LLM calls, SPANS_PER_ROLLOUT to a started rollout."""
    groups: list[list[Any]] = []
    made = 0
    while made < n_spans:
        rollout = await store.start_rollout(input={"question": f"q{made}"})
        size = min(SPANS_PER_ROLLOUT, n_spans - made)
        attempt_id = rollout.attempt.attempt_id
        payloads = bench.payloads
        groups.append(
            [
                bench.kit.span(span_fields(payloads[(made + i) % len(payloads)], rollout.rollout_id, attempt_id, i + 1))
                for i in range(size)
            ]
        )
        made += size
    return groups


async def add_span_rate(store: Any, bench: Bench, n_spans: int, concurrency: int) -> dict[str, float]:
    """Spans/s of `add_span`, one span per call, `concurrency` calls in flight on one handle
    (as in a proxy exporting the spans of concurrent LLM calls)."""
    spans = [s for group in await _span_groups(store, bench, n_spans) for s in group]
    clock = _Clock(bench)
    await pool(spans, concurrency, store.add_span)
    return clock.result(len(spans))


async def add_many_rate(store: Any, bench: Bench, n_spans: int, concurrency: int) -> dict[str, float]:
    """Spans/s of `add_many_spans` with batches of `counts.batch_size` spans of one rollout."""
    batch = bench.counts.batch_size
    groups = await _span_groups(store, bench, n_spans)
    batches = [g[i : i + batch] for g in groups for i in range(0, len(g), batch)]
    clock = _Clock(bench)
    await pool(batches, concurrency, store.add_many_spans)
    return clock.result(n_spans)


async def query_spans_latency(store: Any, bench: Bench) -> dict[str, float]:
    """Median and p90 milliseconds of `query_spans` for one rollout of SPANS_PER_ROLLOUT spans."""
    (group,) = await _span_groups(store, bench, SPANS_PER_ROLLOUT)
    await store.add_many_spans(group)
    rollout_id = group[0].rollout_id
    latencies: list[float] = []
    clock = _Clock(bench)
    for _ in range(bench.counts.queries):
        started = time.perf_counter()
        spans = await store.query_spans(rollout_id)
        latencies.append((time.perf_counter() - started) * 1000.0)
        if len(spans) != SPANS_PER_ROLLOUT:
            raise AssertionError(f"query_spans returned {len(spans)} spans, expected {SPANS_PER_ROLLOUT}")
    out = clock.result(len(latencies))
    out.pop("rate")
    return {"median": statistics.median(latencies), "p90": percentile(latencies, 90), **out}


async def queue_cycle_rate(store: Any, bench: Bench) -> dict[str, float]:
    """Cycles/s of enqueue_rollout → dequeue_rollout → update_attempt(succeeded), one at a time."""
    n_cycles = bench.counts.cycles
    clock = _Clock(bench)
    for i in range(n_cycles):
        await store.enqueue_rollout(input={"question": f"c{i}"})
        claimed = await store.dequeue_rollout(worker_id="bench-worker")
        if claimed is None:
            raise AssertionError("dequeue_rollout returned None right after an enqueue")
        await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    return clock.result(n_cycles)


async def runners_rate(store: Any, bench: Bench) -> dict[str, float]:
    """Rollouts/s of `counts.runners` concurrent runners, each with its own store handle
    (runners are separate processes in real use), each looping: dequeue a rollout, add
    SPANS_PER_RUNNER_ROLLOUT spans one call at a time, mark the attempt succeeded."""
    n_rollouts, n_runners = bench.counts.runner_rollouts, bench.counts.runners
    await store.enqueue_many_rollouts([bench.kit.enqueue_request({"question": f"r{i}"}) for i in range(n_rollouts)])
    done = 0

    async def runner(handle: Any, index: int) -> None:
        nonlocal done
        worker_id = f"runner-{index}"
        # Bounded: each pass consumes one of the n_rollouts queued rollouts or ends the loop.
        for _ in range(n_rollouts):
            claimed = await handle.dequeue_rollout(worker_id=worker_id)
            if claimed is None:
                return
            attempt_id = claimed.attempt.attempt_id
            for seq in range(1, SPANS_PER_RUNNER_ROLLOUT + 1):
                fields = span_fields(bench.payloads[seq % len(bench.payloads)], claimed.rollout_id, attempt_id, seq)
                await handle.add_span(bench.kit.span(fields))
            await handle.update_attempt(claimed.rollout_id, attempt_id, status="succeeded")
            done += 1

    async with contextlib.AsyncExitStack() as stack:
        handles = [await stack.enter_async_context(bench.connect()) for _ in range(n_runners)]
        clock = _Clock(bench)
        await asyncio.gather(*(runner(handle, i) for i, handle in enumerate(handles)))
        result = clock.result(done)
    if done != n_rollouts:
        raise AssertionError(f"runners finished {done} rollouts, expected {n_rollouts}")
    return result


# --- the scenario table ---------------------------------------------------------------

Scenario = Callable[[Any, Bench], Awaitable[dict[str, float]]]


def span_scenarios() -> dict[str, Scenario]:
    """Scenarios of the span and queue paths, keyed by metric name (the transport prefixes it)."""
    return {
        "add_span_c1": lambda s, b: add_span_rate(s, b, b.counts.single_spans, 1),
        "add_span_c16": lambda s, b: add_span_rate(s, b, b.counts.single_spans_c16, 16),
        "add_many_c1": lambda s, b: add_many_rate(s, b, b.counts.batch_spans, 1),
        "add_many_c16": lambda s, b: add_many_rate(s, b, b.counts.batch_spans_c16, 16),
        "query_spans_ms": query_spans_latency,
        "queue_cycles": queue_cycle_rate,
    }


def http_scenarios() -> dict[str, Scenario]:
    """The span scenarios plus the 100-runner workload, which only makes sense served."""
    return {**span_scenarios(), "runners": runners_rate}


def select(scenarios: dict[str, Scenario], only: Sequence[str] | None) -> dict[str, Scenario]:
    """The scenarios named in `only` (all when None); an unknown name is an error."""
    if only is None:
        return scenarios
    known = set(http_scenarios())
    unknown = sorted(set(only) - known)
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; known: {sorted(known)}")
    return {name: fn for name, fn in scenarios.items() if name in only}


async def measure(name: str, scenario: Scenario, bench: Bench, log: Callable[[str], None]) -> dict[str, Any]:
    """Run `scenario` `counts.repeats` times on one store handle.

    Returns {"value": {field: median over runs}, "runs": [each run's fields]}.
    """
    runs: list[dict[str, float]] = []
    async with bench.connect() as store:
        for attempt in range(bench.counts.repeats):
            fields = await scenario(store, bench)
            runs.append(fields)
            shown = ", ".join(f"{k}={v:.2f}" for k, v in fields.items())
            log(f"{name} run {attempt + 1}/{bench.counts.repeats}: {shown}")
    value = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    return {"value": value, "runs": runs}


async def measure_all(
    prefix: str, scenarios: dict[str, Scenario], bench: Bench, log: Callable[[str], None]
) -> dict[str, Any]:
    """`measure` each scenario; results keyed `prefix.name` (the same keys on both sides)."""
    return {f"{prefix}.{name}": await measure(f"{prefix}.{name}", fn, bench, log) for name, fn in scenarios.items()}
