"""The token chain's cost, side by side in one run: a bridged call against today's rendered
pass-through call and the bare backend, at 8, 64 and 256 turns of history.

    .venv/bin/python benchmarks/chain_bench.py                 # 8, 64, 256 turns, 3 batches of 16 calls each
    .venv/bin/python benchmarks/chain_bench.py --turns 8 64 --calls 8 --batches 2

Targets, each its own process, all in front of one fake vLLM (`_chain_fake_engine.py`: fixed
answers, 8 prompt ids per message, the token-in endpoints; not a model, so the figures are the
proxy's own cost, not a model's):

- `direct`: the fake backend's `/v1/chat/completions` (latency floor);
- `rendered`: `agl proxy serve --token-chain off` (today's pass-through; the backend renders);
- `chain`: `agl proxy serve` (auto: the token chain; every measured call is bridged, which the
  run checks in the spans);
- `continuing`: the same, its deployment with `model_info.agl_continue_generations: true` (as the
  trainer registers its replicas): each answer is generated through the streamed generate, one
  chunk per id (`--answer-ids`, 16), so a weight update could stop it and continue it.

Both proxies have their embedded SQLite store and attribute the calls to a rollout, so their CPU
includes the span build and export. A tool-less agent loop builds the history to `turns` turns
(not measured), then `--batches` batches of `--calls` more calls are measured: each proxy
process's CPU (user + system) per call and the median latency per call. Quote medians and the
load average: the machine is shared.

A bridged call makes four engine requests where the pass-through makes one, so the run also
times the HTTP clients on one of them (a bridge's render, `--http-requests` sequential posts
from this process): the chain's `EngineHttp`, aiohttp (`AiohttpTransport.fetch`, what the chain
used before) and httpx, as client CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
from proxy_bench import _agl_rollouts, cpu_seconds, free_port, process, rollout_base_url, wait_ready

BENCH_DIR = Path(__file__).resolve().parent
OBSERVATION = "observation " * 25


def _next_messages(history: list[dict[str, Any]], answer: dict[str, Any], turn: int) -> list[dict[str, Any]]:
    return [*history, answer, {"role": "user", "content": f"{OBSERVATION} {turn}"}]


def _cpu_s(pids: list[int]) -> float:
    """The processes' CPU in seconds: the scheduler's nanoseconds per thread where Linux shows them
    (`/proc/PID/task/*/schedstat`; the proxy's threads live as long as it), else psutil's user +
    system, which the OS counts in 10 ms ticks (0.3 ms per call over a batch of 32)."""
    total = 0.0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            total += sum(int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0]) for t in tasks) / 1e9
        except (OSError, ValueError, IndexError):
            return cpu_seconds(pids)
    return total


async def _call(client: httpx.AsyncClient, url: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    response = await client.post(url, json={"model": "bench", "messages": history, "max_tokens": 16})
    response.raise_for_status()
    message = response.json()["choices"][0]["message"]
    return {"role": "assistant", "content": message["content"]}


async def _measure(base_url: str, pids: list[int], turns: int, calls: int, batches: int) -> dict[str, float]:
    url = base_url + "/chat/completions"
    history = [{"role": "system", "content": "You are a bench."}, {"role": "user", "content": OBSERVATION}]
    cpu, latency = [], []
    async with httpx.AsyncClient(timeout=60) as client:
        for turn in range(turns):
            history = _next_messages(history, await _call(client, url, history), turn)
        for _ in range(batches):
            before = _cpu_s(pids)
            for turn in range(calls):
                t0 = time.perf_counter()
                answer = await _call(client, url, history)
                latency.append(time.perf_counter() - t0)
                history = _next_messages(history, answer, turn)
            if pids:
                cpu.append((_cpu_s(pids) - before) / calls)
    rss = sum(psutil.Process(p).memory_info().rss for p in pids) / 2**20 if pids else 0.0
    return {
        "cpu_ms": statistics.median(cpu) * 1e3 if cpu else 0.0,
        "latency_ms": statistics.median(latency) * 1e3,
        "rss_mib": rss,
    }


async def _client_cpu(engine_url: str, n: int) -> dict[str, float]:
    """This process's CPU per request (µs) of each HTTP client posting a bridge's render to the
    fake engine: the chain's own (`EngineHttp`), the aiohttp path it replaced, and httpx."""
    from agl_proxy.chain.engine_http import EngineHttp
    from agl_store.web.http_transport import AiohttpTransport

    url = engine_url.removesuffix("/v1") + "/v1/chat/completions/render"
    messages = [{"role": "system", "content": "You are a bench."}, {"role": "user", "content": "."},
                {"role": "assistant", "content": "tok " * 16}, {"role": "user", "content": OBSERVATION}]  # fmt: skip
    body = json.dumps({"model": "bench", "messages": messages}).encode()
    headers = {"content-type": "application/json", "x-rollout-id": "ro-bench", "x-attempt-id": "at-bench"}
    request: dict[str, Any] = {"content": body, "headers": headers, "timeout": 60}
    out: dict[str, float] = {}
    lean, aio = EngineHttp(), AiohttpTransport()
    async with httpx.AsyncClient(timeout=60) as client:
        senders: dict[str, Callable[[], Awaitable[object]]] = {
            "EngineHttp (the chain's client)": lambda: lean.fetch("POST", url, **request),
            "aiohttp (AiohttpTransport.fetch)": lambda: aio.fetch("POST", url, **request),
            "httpx (its own transport)": lambda: client.post(url, content=body, headers=headers),
        }  # fmt: skip
        for name, send in senders.items():
            for _ in range(50):
                await send()
            before = time.process_time()
            for _ in range(n):
                await send()
            out[name] = (time.process_time() - before) / n * 1e6
    await lean.aclose()
    await aio.aclose()
    return out


def _engine_requests(engine_url: str) -> Counter[str]:
    return Counter(httpx.get(engine_url.removesuffix("/v1") + "/requests").json())


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def _chain_kinds(url: str, rollout_id: str) -> Counter[str]:
    from agl_store.client import LightningStoreClient

    async with LightningStoreClient(url) as store:
        await asyncio.sleep(1.0)  # the last spans' export
        spans = await store.query_spans(rollout_id, attributes=["agl.chain"])
    return Counter(s.attributes["agl.chain"]["prompt"] for s in spans)


def _continuing_entry(engine_url: str) -> dict[str, Any]:
    return {
        "model_name": "bench",
        "litellm_params": {"model": "hosted_vllm/bench", "api_base": engine_url},
        "model_info": {"agl_continue_generations": True},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--calls", type=int, default=16, help="calls per measured batch")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--answer-ids", type=int, default=16, help="ids in every answer of the fake engine")
    parser.add_argument("--http-requests", type=int, default=2000, help="per HTTP client (0: skip that part)")
    args = parser.parse_args()
    agl = str(Path(sys.executable).parent / "agl")
    rows: list[tuple[str, int, dict[str, float], str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        engine_port = free_port()
        engine_cmd = [sys.executable, str(BENCH_DIR / "_chain_fake_engine.py"), str(engine_port), str(args.answer_ids)]
        with process(engine_cmd, work / "engine.log") as engine:
            engine_url = f"http://127.0.0.1:{engine_port}/v1"
            wait_ready(engine_url + "/models", engine, work / "engine.log")
            clients = asyncio.run(_client_cpu(engine_url, args.http_requests)) if args.http_requests else {}
            for turns in args.turns:
                result = asyncio.run(_measure(engine_url, [], turns, args.calls, args.batches))
                rows.append(("direct", turns, result, "fake backend"))
            continuing = work / "continuing.yaml"
            continuing.write_text(json.dumps({"model_list": [_continuing_entry(engine_url)]}))  # JSON is YAML
            targets = (
                ("rendered", ["--backend", engine_url, "--model", "bench", "--token-chain", "off"]),
                ("chain", ["--backend", engine_url, "--model", "bench"]),
                ("continuing", ["--config", str(continuing)]),
            )
            for name, extra in targets:
                port = free_port()
                cmd = [agl, "proxy", "serve", "--db", str(work / f"{name}.db"), "--port", str(port), *extra]
                with process(cmd, work / f"{name}.log") as proxy:
                    url = f"http://127.0.0.1:{port}"
                    wait_ready(url + "/health", proxy, work / f"{name}.log")
                    for turns in args.turns:
                        [(rollout_id, attempt_id)] = asyncio.run(_agl_rollouts(url, 1))
                        base_url = rollout_base_url(url, rollout_id, attempt_id)
                        before = _engine_requests(engine_url)
                        result = asyncio.run(_measure(base_url, [proxy.pid], turns, args.calls, args.batches))
                        made = _engine_requests(engine_url) - before
                        kinds = asyncio.run(_chain_kinds(url, rollout_id))
                        result["store_reads"] = _metric(url, "agl_proxy_chain_store_reads_total")
                        calls = turns + args.calls * args.batches  # the history built, then the measured ones
                        per_call = ", ".join(f"{p.rsplit('/', 1)[-1]} {n / calls:.2f}" for p, n in sorted(made.items()))
                        spans = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
                        rows.append((name, turns, result, f"{spans}; engine requests per call: {per_call}"))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.batches} batches of "
          f"{args.calls} calls per row; medians")  # fmt: skip
    print(f"{'target':<9} {'turns':>5} {'proxy CPU ms/call':>18} {'latency ms':>11} {'proxy RSS MiB':>14}  spans")
    for name, turns, result, kinds in rows:
        print(f"{name:<9} {turns:>5} {result['cpu_ms']:>18.2f} {result['latency_ms']:>11.2f} "
              f"{result['rss_mib']:>14.0f}  {kinds}; store reads {result.get('store_reads', 0):.0f}")  # fmt: skip
    by = {(name, turns): result for name, turns, result, _ in rows}
    streamed = f"(ms per call; {args.answer_ids} ids streamed)"
    print(f"\n{'turns':>5} {'CPU continuing':>14} {'continuing/chain':>16}   {streamed}")
    for turns in args.turns:
        chain, continuing = by[("chain", turns)], by[("continuing", turns)]
        print(f"{turns:>5} {continuing['cpu_ms']:>14.2f} {continuing['cpu_ms'] / chain['cpu_ms']:>16.2f}")
    print(f"\n{'turns':>5} {'CPU rendered':>12} {'CPU chain':>10} {'chain/rendered':>14} "
          f"{'+latency rendered':>17} {'+latency chain':>14}   (ms per call; +latency: over direct)")  # fmt: skip
    for turns in args.turns:
        chain, rendered, direct = by[("chain", turns)], by[("rendered", turns)], by[("direct", turns)]
        print(f"{turns:>5} {rendered['cpu_ms']:>12.2f} {chain['cpu_ms']:>10.2f} "
              f"{chain['cpu_ms'] / rendered['cpu_ms']:>14.2f} {rendered['latency_ms'] - direct['latency_ms']:>+17.2f} "
              f"{chain['latency_ms'] - direct['latency_ms']:>+14.2f}")  # fmt: skip
    if clients:
        aiohttp_us = clients["aiohttp (AiohttpTransport.fetch)"]
        print(f"\nHTTP client CPU per engine request (a bridge's render, {args.http_requests} sequential):")
        for name, us in clients.items():
            print(f"  {name:<34} {us:>6.0f} µs  ({us / aiohttp_us:.2f} of aiohttp)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
