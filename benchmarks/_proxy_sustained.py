"""Sustained load through one proxy, then every acknowledged call counted against the spans stored.

`proxy_bench.py --sustained-seconds S` runs this against `agl proxy serve` (embedded store) and,
for scale, against the backend itself: `concurrency` clients call as fast as they are answered
for `seconds`, each on its own rollout. A call counts as acknowledged when it answered 200; a
503/429 (the proxy's backpressure) is counted and retried after its `Retry-After`, capped.
Once the load stops the proxy gets SIGTERM (a graceful stop flushes its spans), and the
spans in its database are counted per rollout: `lost` is acknowledged calls without a span.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

RETRY_CAP_S = 0.2
"""The longest a refused client waits before calling again (the proxy says 1 s; the load must not idle)."""
SAMPLE_EVERY_S = 1.0


@dataclass
class SustainedResult:
    target: str
    seconds: float
    concurrency: int
    acknowledged: int
    refused: int
    errors: int
    calls_per_s: float
    exported_in_window: int | None = None
    max_backlog: int | None = None
    spans_stored: int | None = None
    lost: int | None = None
    acknowledged_by_rollout: dict[str, int] = field(default_factory=dict)


def metric(text: str, name: str) -> float | None:
    """The value of an unlabelled Prometheus sample `name` in `text`."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


async def run_sustained(
    target: str,
    base_urls: list[str],
    rollout_ids: list[str],
    metrics_url: str | None,
    seconds: float,
    model: str,
) -> SustainedResult:
    """`len(base_urls)` clients, client i calling `base_urls[i]` (attributed to `rollout_ids[i]`)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Benchmark me."}], "max_tokens": 16}
    acknowledged: dict[str, int] = {rid: 0 for rid in rollout_ids}
    counts = {"refused": 0, "errors": 0}
    backlog: list[float] = []
    connector = aiohttp.TCPConnector(limit=len(base_urls) + 4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        deadline = time.monotonic() + seconds

        async def client(url: str, rollout_id: str) -> None:
            while time.monotonic() < deadline:
                try:
                    async with session.post(url + "/chat/completions", json=body) as response:
                        await response.read()
                        if response.status == 200:
                            acknowledged[rollout_id] += 1
                        elif response.status in (429, 503):
                            counts["refused"] += 1
                            wait = float(response.headers.get("retry-after", "1"))
                            await asyncio.sleep(min(wait, RETRY_CAP_S))
                        else:
                            counts["errors"] += 1
                except (TimeoutError, aiohttp.ClientError):
                    counts["errors"] += 1

        async def sampler() -> None:
            while time.monotonic() < deadline:
                await asyncio.sleep(SAMPLE_EVERY_S)
                backlog.append(await _metric(session, metrics_url, "agl_proxy_spans_buffered") or 0.0)

        t0 = time.monotonic()
        tasks = [client(url, rid) for url, rid in zip(base_urls, rollout_ids, strict=True)]
        if metrics_url:
            tasks.append(sampler())
        await asyncio.gather(*tasks)
        wall = time.monotonic() - t0
        exported = await _metric(session, metrics_url, "agl_proxy_spans_exported_total") if metrics_url else None
    total = sum(acknowledged.values())
    return SustainedResult(
        target=target,
        seconds=wall,
        concurrency=len(base_urls),
        acknowledged=total,
        refused=counts["refused"],
        errors=counts["errors"],
        calls_per_s=total / wall,
        exported_in_window=None if exported is None else int(exported),
        max_backlog=int(max(backlog)) if backlog else None,
        acknowledged_by_rollout=acknowledged,
    )


async def _metric(session: aiohttp.ClientSession, url: str | None, name: str) -> float | None:
    if url is None:
        return None
    async with session.get(url) as response:
        return metric(await response.text(), name)


async def count_spans(db_path: str, rollout_ids: list[str]) -> dict[str, int]:
    """Spans stored per rollout, read from the proxy's database after it stopped."""
    from agl_store.sqlite import SQLiteStore

    async with SQLiteStore(db_path) as store:
        out = {}
        for rid in rollout_ids:
            out[rid] = len(await store.query_spans(rid, limit=-1))
    return out


def settle(result: SustainedResult, stored: dict[str, int]) -> None:
    """Fill in spans stored and calls lost (acknowledged, no span), per rollout summed."""
    result.spans_stored = sum(stored.values())
    result.lost = sum(max(0, n - stored.get(rid, 0)) for rid, n in result.acknowledged_by_rollout.items())


def describe(result: SustainedResult) -> str:
    line = (
        f"{result.target:6} c={result.concurrency} {result.seconds:4.0f} s: {result.calls_per_s:7.1f} calls/s "
        f"({result.acknowledged} acknowledged, {result.refused} refused, {result.errors} errors)"
    )
    if result.exported_in_window is not None:
        line += f", {result.exported_in_window / result.seconds:7.1f} spans/s exported by the end of the load"
    if result.max_backlog is not None:
        line += f", backlog ≤ {result.max_backlog}"
    if result.lost is not None:
        line += f"; after SIGTERM {result.spans_stored} spans stored, {result.lost} acknowledged calls without one"
    return line


def as_dict(result: SustainedResult) -> dict[str, Any]:
    out = dict(result.__dict__)
    out.pop("acknowledged_by_rollout")
    return out
