"""The store client over each HTTP client stack, side by side in one run.

    .venv/bin/python benchmarks/http_client_bench.py            # 5 interleaved rounds
    .venv/bin/python benchmarks/http_client_bench.py --quick    # 2 rounds, fewer calls

One `agl store serve` (SQLite, own process) answers three `LightningStoreClient`s that differ
only in how they send:

- `aiohttp direct`: `LightningStoreClient` itself, its one request path (`AiohttpTransport.fetch`,
  no httpx request objects);
- `httpx+aiohttp`: httpx's client over `AiohttpTransport` (the proxy's forwarding stack, unstreamed);
- `httpx only`: httpx's own transport (h11 over anyio), the one-stack alternative.

The two httpx stacks are the client with its one-request method (`_request`) sent through an
`httpx.AsyncClient` instead, defined here: the client itself has no second path.

Per round and stack: `add_span` one span per call (c=1 and c=16), `add_many_spans` batches of 100,
`query_spans` of a 100-span rollout. The table shows medians over rounds of the client's CPU per call
(this process; the noise-robust number) and the wall-clock rate, and each stack's CPU relative to
`aiohttp direct`. The rounds interleave the stacks so machine noise hits all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(1, str(BENCH_DIR.parent))

import _workload as wl  # noqa: E402
import httpx  # noqa: E402
from store_bench import AglKit, agl_server  # noqa: E402

from agl_store.client import Answer, LightningStoreClient  # noqa: E402
from agl_store.web.http_transport import AiohttpTransport  # noqa: E402


class HttpxStoreClient(LightningStoreClient):
    """The store client sending each request through an `httpx.AsyncClient` on `transport`."""

    def __init__(self, url: str, transport: httpx.AsyncBaseTransport, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._httpx = httpx.AsyncClient(base_url=self.url, transport=transport, timeout=self._timeout)

    async def _request(
        self,
        method: str,
        path: str,
        content: bytes | None,
        params: Any,
        headers: dict[str, str] | None,
        timeout: float | None,
    ) -> Answer:
        answer = await self._httpx.request(
            method,
            path,
            content=content,
            params=params,
            headers=headers,
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )
        return Answer(answer.status_code, answer.headers, answer.content)

    async def close(self) -> None:
        await self._httpx.aclose()
        await super().close()


STACKS: dict[str, Callable[[str], LightningStoreClient]] = {
    "aiohttp direct": lambda url: LightningStoreClient(url, retries=0),
    "httpx+aiohttp": lambda url: HttpxStoreClient(url, AiohttpTransport(max_connections=100), retries=0),
    "httpx only": lambda url: HttpxStoreClient(
        url, httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=100)), retries=0
    ),
}


async def _timed(calls: int, run: Callable[[], Any]) -> dict[str, float]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    await run()
    return {"cpu_ms": (time.process_time() - cpu0) * 1000.0 / calls, "rate": calls / (time.perf_counter() - t0)}


QUERIED_SPANS = 100


async def one_round(url: str, stack: str, n_spans: int, n_queries: int) -> dict[str, dict[str, float]]:
    kit, payloads = AglKit(), wl.payload_pool()
    async with STACKS[stack](url) as store:

        async def spans(n: int) -> list[Any]:
            rollout = await store.start_rollout(input={"stack": stack})
            attempt = rollout.attempt.attempt_id
            return [
                kit.span(wl.span_fields(payloads[i % len(payloads)], rollout.rollout_id, attempt, i + 1))
                for i in range(n)
            ]

        async def added_rollout(n: int) -> str:
            group = await spans(n)
            await store.add_many_spans(group)
            return str(group[0].rollout_id)

        out: dict[str, dict[str, float]] = {}
        await store.add_span((await spans(1))[0])  # warm the connection pool
        single = await spans(n_spans)
        out["add_span c=1"] = await _timed(n_spans, lambda: wl.pool(single, 1, store.add_span))
        single16 = await spans(n_spans)
        out["add_span c=16"] = await _timed(n_spans, lambda: wl.pool(single16, 16, store.add_span))
        batch = await spans(n_spans)
        batches = [batch[i : i + 100] for i in range(0, len(batch), 100)]
        out["add_many_spans x100"] = await _timed(len(batches), lambda: wl.pool(batches, 1, store.add_many_spans))
        rollout_id = await added_rollout(QUERIED_SPANS)  # its own rollout, whatever the batch size above

        async def queries() -> None:
            for _ in range(n_queries):
                await store.query_spans(rollout_id)

        out[f"query_spans {QUERIED_SPANS} spans"] = await _timed(n_queries, queries)
        return out


async def run(url: str, rounds: int, n_spans: int, n_queries: int) -> dict[str, dict[str, list[dict[str, float]]]]:
    results: dict[str, dict[str, list[dict[str, float]]]] = {s: {} for s in STACKS}
    for r in range(rounds):
        for stack in STACKS:
            for line, numbers in (await one_round(url, stack, n_spans, n_queries)).items():
                results[stack].setdefault(line, []).append(numbers)
        print(f"round {r + 1}/{rounds} done", flush=True)
    return results


def table(results: dict[str, dict[str, list[dict[str, float]]]]) -> str:
    def med(stack: str, line: str, key: str) -> float:
        return statistics.median(n[key] for n in results[stack][line])

    lines = ["| call | stack | client CPU ms/call | x direct | calls/s |", "| --- | --- | --- | --- | --- |"]
    for line in results["aiohttp direct"]:
        base = med("aiohttp direct", line, "cpu_ms")
        for stack in STACKS:
            cpu = med(stack, line, "cpu_ms")
            lines.append(f"| {line} | {stack} | {cpu:.3f} | {cpu / base:.2f} | {med(stack, line, 'rate'):.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds, 100 spans and 30 queries per call kind")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 5)
    n_spans, n_queries = (100, 30) if args.quick else (400, 100)
    with tempfile.TemporaryDirectory(prefix="agl-http-bench-") as tmp:
        with agl_server(Path(tmp) / "store.db", Path(tmp) / "server.log") as (url, _pid):
            results = asyncio.run(run(url, rounds, n_spans, n_queries))
    print(table(results))


if __name__ == "__main__":
    main()
