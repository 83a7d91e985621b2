"""agl's proxy measured side by side with a direct call, a bare pass-through and peers, in one run.

    .venv/bin/python benchmarks/proxy_bench.py                 # fast fake backend, all targets
    .venv/bin/python benchmarks/proxy_bench.py --quick         # fewer calls
    .venv/bin/python benchmarks/proxy_bench.py --vllm          # also against the tiny vLLM (starts it)
    .venv/bin/python benchmarks/proxy_bench.py --no-peers --json artifacts/proxy_bench.json
    .venv/bin/python benchmarks/proxy_bench.py --no-scenarios --sustained-repeats 3   # the sustained line only

Every target serves the same OpenAI chat call, streamed and not, at concurrency 1 and 32; `agl` and
`litellm` also serve it through the OpenAI Responses API and Anthropic's Messages API (`--apis`), each
translated to the backend's chat completions, so their CPU per call less the chat line's is what the
translation costs (and, since a server's CPU per call is read in clock ticks, the same translations
are also timed in this process, on the fake backend's answers: `translation CPU` lines):

- `direct`: the backend itself (the latency floor; no proxy CPU);
- `bare`: `_proxy_bare.py`, bytes forwarded with one httpx client, nothing parsed or recorded
  (the CPU floor of any Python proxy);
- `agl`: `agl proxy serve` with its embedded SQLite store in the same process, calls attributed to a
  rollout, so its CPU includes the sequence number, the span build and the span export;
- `al-0.3`: agent-lightning 0.3's `LLMProxy` (LiteLLM proxy + its in-memory store, asyncio mode);
- `litellm`: LiteLLM's own proxy (`litellm --config`), no tracing.

Then the sustained-load line (`_proxy_sustained.py`): 16 clients, one rollout each, call `agl` as
fast as it answers for `--sustained-seconds` (60; 10 with `--quick`), and the backend directly for
scale (`direct`: what the load generator and backend reach without a proxy); after a SIGTERM the
spans in the proxy's database are counted against the acknowledged calls, so the line says how many
calls/s were held and how many acknowledged calls have no span (must be 0). With
`--sustained-repeats N` the pair runs N times and the verdict quotes medians.

Peers run from the agent-lightning 0.3 venv (`.cache/peers/agentlightning-0.3`, see `_peers.py`)
and are skipped with the reason when they cannot start. Each server runs in its own process; its
CPU (user + system, with children) is read from the OS before and after each scenario and divided
by the calls. The load generator runs here. Two shared cores are noisy: compare columns of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from _peers import peer_python
from _proxy_sustained import SustainedResult, as_dict, count_spans, describe, run_sustained, settle

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
PEER_PYTHON = peer_python()
# LiteLLM's proxy refuses to boot without a master key unless told this is local use.
PEER_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"}
START_TIMEOUT_S = 120.0
MODEL = "bench"
SUSTAINED_CLIENTS = 16
APIS = ("chat", "responses", "messages")
# The client APIs each target serves; the backend and the bare pass-through speak only chat.
TARGET_APIS = {"agl": APIS, "litellm": APIS}


@dataclass
class Target:
    name: str
    base_url: str
    pids: list[int]
    note: str = ""


@dataclass
class Result:
    target: str
    backend: str
    api: str
    stream: bool
    concurrency: int
    calls: int
    errors: int
    calls_per_s: float
    mean_ms: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_call: float | None
    added_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the processes and all their children, in seconds."""
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    times = p.cpu_times()
                    total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


@contextlib.contextmanager
def process(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=REPO_ROOT
        )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(url: str, proc: subprocess.Popen, log: Path, headers: dict[str, str] | None = None) -> float:
    """Seconds until `url` answers 200; RuntimeError with the log tail if the process dies first."""
    start = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode}: {log.read_text(errors='replace')[-1500:]}")
        if time.monotonic() - start > START_TIMEOUT_S:
            raise RuntimeError(f"not ready after {START_TIMEOUT_S:.0f} s: {log.read_text(errors='replace')[-1500:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2, headers=headers).status_code == 200:
                return time.monotonic() - start
        time.sleep(0.05)


async def one_call(client: httpx.AsyncClient, url: str, body: dict[str, Any], stream: bool) -> float:
    t0 = time.perf_counter()
    if stream:
        async with client.stream("POST", url, json=body) as response:
            async for _ in response.aiter_raw():
                pass
            response.raise_for_status()
    else:
        response = await client.post(url, json=body)
        response.raise_for_status()
    return time.perf_counter() - t0


def api_call(api: str, model: str, stream: bool, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """(path under the base URL, body) of the same one-question call in `api`."""
    question = [{"role": "user", "content": "Benchmark me."}]
    common = {"model": model, "temperature": 0, "stream": stream}
    if api == "responses":
        return "/responses", {**common, "input": question, "max_output_tokens": max_tokens}
    if api == "messages":
        return "/messages", {**common, "messages": question, "max_tokens": max_tokens}
    return "/chat/completions", {**common, "messages": question, "max_tokens": max_tokens}


async def run_load(
    target: Target, backend: str, model: str, api: str, stream: bool, concurrency: int, calls: int, max_tokens: int
) -> Result:
    path, body = api_call(api, model, stream, max_tokens)
    url = target.base_url + path
    latencies: list[float] = []
    errors = 0
    remaining = [calls]
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        for _ in range(min(10, calls)):  # warm connections and caches
            with contextlib.suppress(httpx.HTTPError):
                await one_call(client, url, body, stream)

        async def worker() -> None:
            nonlocal errors
            while remaining[0] > 0:
                remaining[0] -= 1
                try:
                    latencies.append(await one_call(client, url, body, stream))
                except httpx.HTTPError:
                    errors += 1

        cpu0 = cpu_seconds(target.pids)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        cpu1 = cpu_seconds(target.pids)
    lat = sorted(latencies) or [float("nan")]
    done = len(latencies)
    return Result(
        target=target.name,
        backend=backend,
        api=api,
        stream=stream,
        concurrency=concurrency,
        calls=done,
        errors=errors,
        calls_per_s=done / wall if wall else 0.0,
        mean_ms=statistics.fmean(lat) * 1000,
        p50_ms=lat[len(lat) // 2] * 1000,
        p99_ms=lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
        cpu_ms_per_call=(cpu1 - cpu0) / done * 1000 if target.pids and done else None,
    )


@contextlib.contextmanager
def agl_proxy(
    backend_url: str, model: str, db: Path, log: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes], float]]:
    """`agl proxy serve` with its embedded store in `db`: (url, process, seconds until it answered /health)."""
    port = free_port()
    agl = str(Path(sys.executable).parent / "agl")
    cmd = [agl, "proxy", "serve", "--backend", backend_url, "--model", model, "--db", str(db), "--port", str(port)]
    with process(cmd, log) as proc:
        url = f"http://127.0.0.1:{port}"
        yield url, proc, wait_ready(url + "/health", proc, log)


@contextlib.contextmanager
def agl_target(backend_url: str, model: str, workdir: Path, ready: dict[str, float]) -> Iterator[Target]:
    with agl_proxy(backend_url, model, workdir / "agl.db", workdir / "agl-proxy.log") as (url, proc, ready_s):
        ready["agl"] = ready_s
        [(rollout_id, attempt_id)] = asyncio.run(_agl_rollouts(url, 1))
        yield Target(
            "agl", rollout_base_url(url, rollout_id, attempt_id), [proc.pid], "embedded SQLite store, spans exported"
        )


def rollout_base_url(url: str, rollout_id: str, attempt_id: str) -> str:
    """The OpenAI base URL an agent of this rollout attempt is given."""
    return f"{url}/rollout/{rollout_id}/attempt/{attempt_id}/v1"


async def _agl_rollouts(url: str, n: int) -> list[tuple[str, str]]:
    """(rollout id, attempt id) of `n` rollouts started through the proxy's store."""
    from agl_store.client import LightningStoreClient

    async with LightningStoreClient(url) as store:
        rollouts = [await store.start_rollout(input={"bench": True}) for _ in range(n)]
        return [(rollout.rollout_id, rollout.attempt.attempt_id) for rollout in rollouts]


@contextlib.contextmanager
def bare_target(backend_url: str, workdir: Path) -> Iterator[Target]:
    port = free_port()
    log = workdir / "bare.log"
    with process([sys.executable, str(BENCH_DIR / "_proxy_bare.py"), str(port), backend_url], log) as proc:
        wait_ready(f"http://127.0.0.1:{port}/health", proc, log)
        yield Target("bare", f"http://127.0.0.1:{port}/v1", [proc.pid], "httpx byte pass-through, no spans")


@contextlib.contextmanager
def al03_target(backend_url: str, model: str, workdir: Path) -> Iterator[Target]:
    port = free_port()
    log = workdir / "al03.log"
    with process(
        [str(PEER_PYTHON), str(BENCH_DIR / "_proxy_peer.py"), str(port), backend_url, model], log, PEER_ENV
    ) as proc:
        start = time.monotonic()
        while True:
            text = log.read_text(errors="replace")
            line = next((row for row in text.splitlines() if row.startswith('{"rollout_id"')), None)
            if line:
                break
            if proc.poll() is not None or time.monotonic() - start > START_TIMEOUT_S:
                raise RuntimeError(f"agent-lightning 0.3 proxy did not start: {text[-1500:]}")
            time.sleep(0.2)
        ids = json.loads(line)
        base = rollout_base_url(f"http://127.0.0.1:{port}", ids["rollout_id"], ids["attempt_id"])
        yield Target("al-0.3", base, [proc.pid], "agent-lightning 0.3 LLMProxy + in-memory store")


@contextlib.contextmanager
def litellm_target(backend_url: str, model: str, workdir: Path) -> Iterator[Target]:
    port = free_port()
    log = workdir / "litellm.log"
    config = workdir / "litellm.yaml"
    config.write_text(
        json.dumps(
            {
                "model_list": [
                    {"model_name": model, "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": backend_url}}
                ]
            }
        )
    )
    litellm = PEER_PYTHON.parent / "litellm"
    with process(
        [str(litellm), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)], log, PEER_ENV
    ) as proc:
        wait_ready(f"http://127.0.0.1:{port}/health/liveliness", proc, log)
        yield Target("litellm", f"http://127.0.0.1:{port}/v1", [proc.pid], "LiteLLM proxy, no tracing")


def sustained_agl(backend_url: str, workdir: Path, seconds: float) -> SustainedResult:
    """`agl proxy serve` under sustained load, stopped with SIGTERM, its spans counted against the calls."""
    db = workdir / "sustained.db"
    with agl_proxy(backend_url, MODEL, db, workdir / "agl-sustained.log") as (url, proc, _):
        rollouts = asyncio.run(_agl_rollouts(url, SUSTAINED_CLIENTS))
        bases = [rollout_base_url(url, rid, aid) for rid, aid in rollouts]
        ids = [rid for rid, _ in rollouts]
        result = await_(run_sustained("agl", bases, ids, url + "/metrics", seconds, MODEL))
        proc.terminate()  # SIGTERM: the graceful stop must flush every span
        proc.wait(120)
    settle(result, await_(count_spans(str(db), ids)))
    return result


def sustained_direct(backend_url: str, workdir: Path, seconds: float) -> SustainedResult:
    ids = [f"direct-{i}" for i in range(SUSTAINED_CLIENTS)]
    return await_(run_sustained("direct", [backend_url] * SUSTAINED_CLIENTS, ids, None, seconds, MODEL))


def bench_backend(
    args: argparse.Namespace,
    backend: str,
    backend_url: str,
    model: str,
    workdir: Path,
    results: list[Result],
    notes: list[str],
    ready: dict[str, float],
) -> None:
    calls = args.calls if backend == "fake" else args.vllm_calls
    max_tokens = 16 if backend == "fake" else 8
    makers = [("direct", lambda: contextlib.nullcontext(Target("direct", backend_url, [], "the backend itself"))),
              ("bare", lambda: bare_target(backend_url, workdir)),
              ("agl", lambda: agl_target(backend_url, model, workdir, ready))]  # fmt: skip
    if not args.no_peers and backend == "fake":
        makers += [
            ("al-0.3", lambda: al03_target(backend_url, model, workdir)),
            ("litellm", lambda: litellm_target(backend_url, model, workdir)),
        ]
    for name, make in makers:
        if args.only and name not in args.only.split(","):
            continue
        apis = [api for api in TARGET_APIS.get(name, ("chat",)) if api in args.apis.split(",")]
        try:
            with make() as target:
                for api in apis:
                    for stream in (False, True):
                        for concurrency in (1, 32):
                            n = calls if concurrency > 1 else max(10, calls // 2)
                            if name == "al-0.3":
                                n = max(10, n // 4)  # ~50 ms of CPU per call: keep its turn short
                            load = run_load(target, backend, model, api, stream, concurrency, n, max_tokens)
                            result = await_(load)
                            results.append(result)
                            cpu = float("nan") if result.cpu_ms_per_call is None else result.cpu_ms_per_call
                            errors = f"  errors {result.errors}" if result.errors else ""
                            print(
                                f"  {backend:5} {name:8} {api:9} stream={str(stream):5} c={concurrency:<3} "
                                f"{result.calls_per_s:8.1f}/s mean {result.mean_ms:7.2f} ms  "
                                f"cpu {cpu:6.2f} ms/call{errors}",
                                flush=True,
                            )
        except (RuntimeError, OSError) as exc:
            notes.append(f"{backend}/{name}: skipped: {str(exc).strip()[:400]}")
            print(f"  {backend:5} {name:8} skipped: {str(exc).strip()[:200]}", flush=True)


def await_(coro: Any) -> Any:
    return asyncio.run(coro)


def add_deltas(results: list[Result]) -> None:
    # Every API's latency is compared with the backend's own chat call.
    direct = {(r.backend, r.stream, r.concurrency): r.mean_ms for r in results if r.target == "direct"}
    for r in results:
        base = direct.get((r.backend, r.stream, r.concurrency))
        r.added_ms = None if base is None else r.mean_ms - base


def table(results: list[Result]) -> str:
    lines = [
        "| backend | target | api | stream | c | calls/s | mean ms | p50 ms | p99 ms | added ms vs direct "
        "| server CPU ms/call |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cpu = "-" if r.cpu_ms_per_call is None else f"{r.cpu_ms_per_call:.2f}"
        added = "-" if r.added_ms is None else f"{r.added_ms:+.2f}"
        lines.append(
            f"| {r.backend} | {r.target} | {r.api} | {'yes' if r.stream else 'no'} | {r.concurrency} "
            f"| {r.calls_per_s:.1f} "
            f"| {r.mean_ms:.2f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {added} | {cpu} |"
        )
    return "\n".join(lines)


def verdict(results: list[Result], ready: dict[str, float]) -> list[str]:
    out = []
    by = {(r.backend, r.target, r.stream, r.concurrency): r for r in results if r.api == "chat"}
    for c in (1, 32):
        agl, bare = by.get(("fake", "agl", False, c)), by.get(("fake", "bare", False, c))
        if agl and agl.cpu_ms_per_call is not None:
            line = f"non-stream c={c}: agl {agl.cpu_ms_per_call:.2f} ms CPU/call (aim ≤ 1.5)"
            if bare and bare.cpu_ms_per_call:
                line += f", {agl.cpu_ms_per_call / bare.cpu_ms_per_call:.2f}× bare pass-through (aim ≤ 2×)"
            peer = by.get(("fake", "al-0.3", False, c))
            if peer and peer.cpu_ms_per_call:
                ratio = peer.cpu_ms_per_call / agl.cpu_ms_per_call
                line += f", agent-lightning 0.3 {peer.cpu_ms_per_call:.1f} ms ({ratio:.0f}× agl)"
            out.append(line)
    out += translation_verdict(results)
    if "agl" in ready:
        out.append(f"agl proxy serve ready in {ready['agl']:.2f} s (aim ≤ 3 s)")
    return out


def translation_cpu(calls: int) -> list[str]:
    """CPU per call that agl's translations add, timed here: request to chat, the chat answer (body or
    stream, the fake backend's bytes) through `TranslatingSend` to the client's format."""
    sys.path.insert(0, str(REPO_ROOT))
    from _proxy_fake_backend import _chat, _chunks

    from agl_proxy.translate.base import ClientApi, TranslatingSend
    from agl_proxy.translate.messages import MESSAGES
    from agl_proxy.translate.responses import RESPONSES

    async def discard(message: Any) -> None:
        pass

    async def one(api: ClientApi, body: dict[str, Any], answer: list[bytes], content_type: bytes) -> None:
        send = TranslatingSend(discard, api)
        send.request = body
        api.chat_request(body)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
        for data in answer:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def run() -> list[str]:
        out = []
        for api_name, api in (("responses", RESPONSES), ("messages", MESSAGES)):
            for stream in (False, True):
                _, body = api_call(api_name, MODEL, stream, 16)
                answer = _chunks(MODEL) if stream else [_chat(MODEL)]
                content_type = b"text/event-stream" if stream else b"application/json"
                t0 = time.process_time()
                for _ in range(calls):
                    await one(api, body, answer, content_type)
                cost_ms = (time.process_time() - t0) / calls * 1000
                aim = "" if stream else " (aim ≤ 0.3)"
                kind = "stream of 16 tokens" if stream else "non-stream"
                out.append(f"translation CPU, {api_name} {kind}: {cost_ms:.3f} ms/call{aim}")
        return out + [litellm_adapter_cpu(calls)]

    return asyncio.run(run())


def litellm_adapter_cpu(calls: int) -> str:
    """The same non-streamed Messages call through LiteLLM's own Anthropic adapter (what its proxy runs), timed here."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from _proxy_fake_backend import _chat
    from litellm import ModelResponse
    from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter

    adapter = AnthropicAdapter()
    # The model as LiteLLM's proxy hands it to the adapter: with its provider.
    _, body = api_call("messages", "hosted_vllm/" + MODEL, False, 16)
    answer = _chat(MODEL)
    t0 = time.process_time()
    for _ in range(calls):
        adapter.translate_completion_input_params(dict(body))
        reply = adapter.translate_completion_output_params(ModelResponse(**json.loads(answer)))
        json.dumps(reply if isinstance(reply, dict) else reply.model_dump())  # type: ignore[union-attr]
    cost_ms = (time.process_time() - t0) / calls * 1000
    what = "LiteLLM's AnthropicAdapter (request and response only)"
    return f"translation CPU, messages non-stream, {what}: {cost_ms:.3f} ms/call"


def translation_verdict(results: list[Result]) -> list[str]:
    """Per translated API: its CPU per call over the chat line's, agl beside LiteLLM's proxy."""
    cpu = {(r.target, r.api, r.stream, r.concurrency): r.cpu_ms_per_call for r in results if r.backend == "fake"}
    out = []
    for api in APIS[1:]:
        for stream in (False, True):
            parts = []
            for target in ("agl", "litellm"):
                costs = [
                    (own, base)
                    for c in (1, 32)
                    if (own := cpu.get((target, api, stream, c))) is not None
                    and (base := cpu.get((target, "chat", stream, c))) is not None
                ]
                if costs:
                    extra = statistics.fmean(own - base for own, base in costs)
                    parts.append(f"{target} {extra:+.2f} ms CPU/call over its chat calls")
            if parts:
                aim = " (aim ≤ +0.3 for agl)" if not stream else ""
                out.append(f"{api} {'stream' if stream else 'non-stream'}: " + ", ".join(parts) + aim)
    return out


def sustained_verdict(sustained: list[SustainedResult]) -> list[str]:
    agl = [r for r in sustained if r.target == "agl"]
    direct = [r for r in sustained if r.target == "direct"]
    if not agl:
        return []
    rate = statistics.median(r.calls_per_s for r in agl)
    lost = sum(r.lost or 0 for r in agl)
    calls = sum(r.acknowledged for r in agl)
    line = (
        f"sustained: agl held {rate:.0f} calls/s (median of {len(agl)} runs of {agl[0].seconds:.0f} s) with "
        f"{lost} of {calls} acknowledged calls without a span (aim ≥ 1,000 calls/s, 0 lost)"
    )
    if direct:
        line += f"; {rate / statistics.median(r.calls_per_s for r in direct):.2f}× the backend called directly"
    return [line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls (smoke run)")
    parser.add_argument(
        "--calls", type=int, default=600, help="calls per scenario at c=32 against the fake backend (half at c=1)"
    )
    parser.add_argument("--vllm", action="store_true", help="also run against the tiny vLLM (starts it; minutes)")
    parser.add_argument("--vllm-calls", type=int, default=64)
    parser.add_argument("--no-peers", action="store_true", help="skip agent-lightning 0.3 and LiteLLM's proxy")
    parser.add_argument("--only", help="comma-separated targets: direct,bare,agl,al-0.3,litellm")
    parser.add_argument(
        "--apis",
        default=",".join(APIS),
        help="comma-separated client APIs for agl and litellm: chat,responses,messages",
    )
    parser.add_argument(
        "--sustained-seconds", type=float, default=60.0, help="sustained-load line: seconds per target (0 skips)"
    )
    parser.add_argument("--sustained-repeats", type=int, default=1, help="runs of the sustained-load line (medians)")
    parser.add_argument("--no-scenarios", action="store_true", help="only the sustained-load line")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.vllm_calls = 120, 16
        args.sustained_seconds = min(args.sustained_seconds, 10.0)
    if not PEER_PYTHON.exists() and not args.no_peers:
        print(f"peers: no venv at {PEER_PYTHON} (benchmarks/store_bench.py creates it); running without them")
        args.no_peers = True

    results: list[Result] = []
    notes: list[str] = []
    ready: dict[str, float] = {}
    sustained: list[SustainedResult] = []
    with tempfile.TemporaryDirectory(prefix="agl-proxy-bench-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        log = workdir / "fake.log"
        with process([sys.executable, str(BENCH_DIR / "_proxy_fake_backend.py"), str(port)], log) as fake:
            wait_ready(f"http://127.0.0.1:{port}/v1/models", fake, log)
            if not args.no_scenarios:
                print("against the fast fake backend:", flush=True)
                bench_backend(args, "fake", f"http://127.0.0.1:{port}/v1", MODEL, workdir, results, notes, ready)
            if args.sustained_seconds > 0:
                print(
                    f"sustained load, {SUSTAINED_CLIENTS} clients, {args.sustained_seconds:g} s per target:", flush=True
                )
                for _ in range(args.sustained_repeats):
                    for name, run in (("agl", sustained_agl), ("direct", sustained_direct)):
                        if args.only and name not in args.only.split(","):
                            continue
                        sustained.append(run(f"http://127.0.0.1:{port}/v1", workdir, args.sustained_seconds))
                        print("  " + describe(sustained[-1]), flush=True)
        if args.vllm:
            sys.path.insert(0, str(REPO_ROOT))
            from examples.tiny_vllm.vllm_server import build_tiny_model, running_vllm_server

            print("against the tiny vLLM (starting it):", flush=True)
            with running_vllm_server(build_tiny_model(), log_path=workdir / "vllm.log") as server:
                bench_backend(args, "vllm", server.base_url, server.model, workdir, results, notes, ready)
    add_deltas(results)
    print()
    print(table(results))
    print()
    lines = verdict(results, ready) + sustained_verdict(sustained)
    if any(api != "chat" for api in args.apis.split(",")):
        lines += translation_cpu(2000)
    for line in lines + notes:
        print("- " + line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "results": [asdict(r) for r in results],
                    "sustained": [as_dict(r) for r in sustained],
                    "notes": notes,
                    "ready_s": ready,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
