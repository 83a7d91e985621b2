"""The store benchmark's workload: realistic LLM-call spans and the timed scenarios.

One implementation runs against both stores, so the numbers compare like with like:
`store_bench.py` drives agl's stores with it, `_peer_worker.py` drives agent-lightning
0.3's from the peer's own interpreter. Hence stdlib only, and the two stores differ only
through a `StoreKit` (how to build a span and an enqueue request from plain dicts).

Every loop is bounded by a count, never by a clock; a scenario returns one number per run.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Optional, Protocol, Sequence

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

    def span(self, fields: Dict[str, Any]) -> Any:
        """A span object of this library from docs/spans.md-shaped plain fields."""

    def enqueue_request(self, input: Any) -> Any:
        """An `EnqueueRolloutRequest` of this library for `input`."""


@dataclass(frozen=True)
class Counts:
    """How much work one run of each scenario does (identical for agl and the peer)."""

    single_spans: int = 600
    single_spans_c16: int = 1200
    batch_spans: int = 2000
    batch_spans_c16: int = 2400
    batch_size: int = 100
    queries: int = 200
    cycles: int = 300
    runner_rollouts: int = 400
    runners: int = 100
    repeats: int = 3

    @classmethod
    def quick(cls) -> "Counts":
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


def llm_call_payload(seed: int) -> Dict[str, Any]:
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


def payload_pool() -> List[Dict[str, Any]]:
    return [llm_call_payload(seed) for seed in range(PAYLOAD_VARIANTS)]


def span_fields(payload: Dict[str, Any], rollout_id: str, attempt_id: str, sequence_id: int) -> Dict[str, Any]:
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


def otel_flat(attributes: Dict[str, Any]) -> Dict[str, Any]:
    """Attributes as OpenTelemetry allows them (agent-lightning 0.3's `Span` does):
    objects become JSON strings, nulls are left out, int and float arrays stay arrays."""
    flat: Dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)):
            flat[key] = json.dumps(value)
        else:
            flat[key] = value
    return flat


def payload_bytes(payload: Dict[str, Any]) -> int:
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


async def _pool(items: Iterable[Any], concurrency: int, fn: Callable[[Any], Awaitable[Any]]) -> None:
    """Run `fn` over `items` with at most `concurrency` calls in flight."""
    it = iter(items)

    async def worker() -> None:
        # Tasks share one iterator: asyncio is single-threaded, so each item goes out once.
        for item in it:
            await fn(item)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _start_rollouts(store: Any, n: int) -> List[Any]:
    return [await store.start_rollout(input={"question": f"q{i}"}) for i in range(n)]


async def _span_objects(store: Any, kit: StoreKit, payloads: List[Dict[str, Any]], n_spans: int) -> List[List[Any]]:
    """Spans for `n_spans` LLM calls, grouped by rollout, SPANS_PER_ROLLOUT to a rollout."""
    groups: List[List[Any]] = []
    rollouts = await _start_rollouts(store, -(-n_spans // SPANS_PER_ROLLOUT))
    made = 0
    for rollout in rollouts:
        size = min(SPANS_PER_ROLLOUT, n_spans - made)
        attempt_id = rollout.attempt.attempt_id
        groups.append(
            [
                kit.span(span_fields(payloads[(made + i) % len(payloads)], rollout.rollout_id, attempt_id, i + 1))
                for i in range(size)
            ]
        )
        made += size
    return groups


async def add_span_rate(store: Any, kit: StoreKit, payloads: List[Dict[str, Any]], n_spans: int, concurrency: int) -> float:
    """Spans/s of `add_span`, one span per call, `concurrency` calls in flight."""
    spans = [s for group in await _span_objects(store, kit, payloads, n_spans) for s in group]
    started = time.perf_counter()
    await _pool(spans, concurrency, store.add_span)
    return len(spans) / (time.perf_counter() - started)


async def add_many_rate(
    store: Any, kit: StoreKit, payloads: List[Dict[str, Any]], n_spans: int, batch: int, concurrency: int
) -> float:
    """Spans/s of `add_many_spans` with batches of `batch` spans of one rollout."""
    groups = await _span_objects(store, kit, payloads, n_spans)
    batches = [g[i : i + batch] for g in groups for i in range(0, len(g), batch)]
    started = time.perf_counter()
    await _pool(batches, concurrency, store.add_many_spans)
    return n_spans / (time.perf_counter() - started)


async def query_spans_latency(store: Any, kit: StoreKit, payloads: List[Dict[str, Any]], n_queries: int) -> Dict[str, float]:
    """Median and p90 milliseconds of `query_spans` for one rollout of SPANS_PER_ROLLOUT spans."""
    (group,) = await _span_objects(store, kit, payloads, SPANS_PER_ROLLOUT)
    await store.add_many_spans(group)
    rollout_id = group[0].rollout_id
    latencies: List[float] = []
    for _ in range(n_queries):
        started = time.perf_counter()
        spans = await store.query_spans(rollout_id)
        latencies.append((time.perf_counter() - started) * 1000.0)
        if len(spans) != SPANS_PER_ROLLOUT:
            raise AssertionError(f"query_spans returned {len(spans)} spans, expected {SPANS_PER_ROLLOUT}")
    return {"median": statistics.median(latencies), "p90": percentile(latencies, 90)}


async def queue_cycle_rate(store: Any, n_cycles: int) -> float:
    """Cycles/s of enqueue_rollout → dequeue_rollout → update_attempt(succeeded), one at a time."""
    started = time.perf_counter()
    for i in range(n_cycles):
        await store.enqueue_rollout(input={"question": f"c{i}"})
        claimed = await store.dequeue_rollout(worker_id="bench-worker")
        if claimed is None:
            raise AssertionError("dequeue_rollout returned None right after an enqueue")
        await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    return n_cycles / (time.perf_counter() - started)


async def runners_rate(
    store: Any, kit: StoreKit, payloads: List[Dict[str, Any]], n_rollouts: int, n_runners: int
) -> float:
    """Rollouts/s with `n_runners` concurrent runners, each looping: dequeue a rollout,
    add SPANS_PER_RUNNER_ROLLOUT spans one call at a time, mark the attempt succeeded."""
    await store.enqueue_many_rollouts([kit.enqueue_request({"question": f"r{i}"}) for i in range(n_rollouts)])
    done = 0

    async def runner(index: int) -> None:
        nonlocal done
        worker_id = f"runner-{index}"
        # Bounded: each pass consumes one of the n_rollouts queued rollouts or ends the loop.
        for _ in range(n_rollouts):
            claimed = await store.dequeue_rollout(worker_id=worker_id)
            if claimed is None:
                return
            attempt_id = claimed.attempt.attempt_id
            for seq in range(1, SPANS_PER_RUNNER_ROLLOUT + 1):
                fields = span_fields(payloads[seq % len(payloads)], claimed.rollout_id, attempt_id, seq)
                await store.add_span(kit.span(fields))
            await store.update_attempt(claimed.rollout_id, attempt_id, status="succeeded")
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(runner(i) for i in range(n_runners)))
    elapsed = time.perf_counter() - started
    if done != n_rollouts:
        raise AssertionError(f"runners finished {done} rollouts, expected {n_rollouts}")
    return done / elapsed


# --- the scenario table ---------------------------------------------------------------

Scenario = Callable[[Any, StoreKit, List[Dict[str, Any]], Counts], Awaitable[Any]]


def span_scenarios() -> Dict[str, Scenario]:
    """Scenarios of the span path, keyed by metric name (prefixed by the transport)."""
    return {
        "add_span_c1": lambda s, k, p, c: add_span_rate(s, k, p, c.single_spans, 1),
        "add_span_c16": lambda s, k, p, c: add_span_rate(s, k, p, c.single_spans_c16, 16),
        "add_many_c1": lambda s, k, p, c: add_many_rate(s, k, p, c.batch_spans, c.batch_size, 1),
        "add_many_c16": lambda s, k, p, c: add_many_rate(s, k, p, c.batch_spans_c16, c.batch_size, 16),
        "query_spans_ms": lambda s, k, p, c: query_spans_latency(s, k, p, c.queries),
        "queue_cycles": lambda s, k, p, c: queue_cycle_rate(s, c.cycles),
    }


def runner_scenario() -> Scenario:
    return lambda s, k, p, c: runners_rate(s, k, p, c.runner_rollouts, c.runners)


def median_of_runs(runs: List[Any]) -> Any:
    """The median over runs: of numbers, or field by field of dicts of numbers."""
    if isinstance(runs[0], dict):
        return {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    return statistics.median(runs)


async def measure(
    name: str,
    scenario: Scenario,
    store_factory: Callable[[], Any],
    kit: StoreKit,
    payloads: List[Dict[str, Any]],
    counts: Counts,
    log: Callable[[str], None],
    fresh_store: bool = False,
) -> Dict[str, Any]:
    """Run `scenario` `counts.repeats` times; {"value": median, "runs": [...]}.

    `store_factory` returns an async context manager yielding the store; with
    `fresh_store` each run gets a new one (the runner scenario needs an empty queue).
    """
    runs: List[Any] = []
    store_cm: Optional[Any] = None
    store: Any = None
    try:
        for attempt in range(counts.repeats):
            if store is None or fresh_store:
                if store_cm is not None:
                    await store_cm.__aexit__(None, None, None)
                store_cm = store_factory()
                store = await store_cm.__aenter__()
            value = await scenario(store, kit, payloads, counts)
            runs.append(value)
            log(f"{name} run {attempt + 1}/{counts.repeats}: {_fmt(value)}")
    finally:
        if store_cm is not None:
            await store_cm.__aexit__(None, None, None)
    return {"value": median_of_runs(runs), "runs": runs}


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v:.2f}" for k, v in value.items())
    return f"{value:.1f}"
