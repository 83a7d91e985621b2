"""Runs the store workload against agent-lightning 0.3, inside the peer's own venv.

Started by `store_bench.py` (through `_peers.run_peer_worker`) as
`PEER_PYTHON _peer_worker.py --counts JSON`. Imports only agentlightning, the stdlib and
`_workload` (stdlib only, found beside this file). Progress lines go to stderr, prefixed
`peer`; the results are one JSON object on stdout.

In process it uses `InMemoryLightningStore` (0.3 has no SQLite backend); over HTTP it starts
0.3's own `agl store` server (`agentlightning.cli.store`, the in-memory store behind
FastAPI) as a subprocess and talks to it with 0.3's `LightningStoreClient`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import _workload as wl
from _serving import served

# agentlightning imports litellm, which otherwise spends the first seconds of the run (and
# a core) retrying a download of its cost map from a host this machine cannot reach.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from agentlightning.store import InMemoryLightningStore, LightningStoreClient
from agentlightning.types import EnqueueRolloutRequest, Span

# Seconds to wait for the peer server's /health; it imports litellm and fastapi first.
SERVER_START_TIMEOUT_S = 120.0


class PeerKit:
    """agent-lightning 0.3 spans: OpenTelemetry-typed attributes (see `_workload.otel_flat`)."""

    def span(self, fields: dict[str, Any]) -> Any:
        return Span(**{**fields, "attributes": wl.otel_flat(fields["attributes"])})

    def enqueue_request(self, input: Any) -> Any:
        return EnqueueRolloutRequest(input=input)


def log(message: str) -> None:
    print(f"peer: {message}", file=sys.stderr, flush=True)


def peer_server() -> Any:
    """0.3's `agl store` (in-memory store, `asyncio` launch mode: one process) on a free
    127.0.0.1 port; a context manager yielding (url, pid)."""
    return served(
        lambda port: [
            sys.executable,
            "-m",
            "agentlightning.cli.store",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "WARNING",
        ],
        SERVER_START_TIMEOUT_S,
    )


def http_client_factory(url: str) -> Callable[[], Any]:
    @contextlib.asynccontextmanager
    async def client() -> AsyncIterator[Any]:
        # No retries: a failing request should fail the run, not hide inside its time.
        store = LightningStoreClient(url, retry_delays=(), health_retry_delays=())
        try:
            yield store
        finally:
            await store.close()

    return client


async def run(counts: wl.Counts, transports: list[str], only: list[str] | None) -> dict[str, Any]:
    kit = PeerKit()
    payloads = wl.payload_pool()
    results: dict[str, Any] = {}
    if "inproc" in transports:
        # One store per scenario, shared by its runs (as agl's side shares one SQLite file).
        for name, scenario in wl.select(wl.span_scenarios(), only).items():
            store = InMemoryLightningStore(thread_safe=True)

            @contextlib.asynccontextmanager
            async def same_store(store: Any = store) -> AsyncIterator[Any]:
                yield store

            bench = wl.Bench(kit=kit, payloads=payloads, counts=counts, connect=same_store)
            results.update(await wl.measure_all("inproc", {name: scenario}, bench, log))
    if "http" in transports:
        with peer_server() as (url, pid):
            bench = wl.Bench(
                kit=kit, payloads=payloads, counts=counts, connect=http_client_factory(url), server_pid=pid
            )
            results.update(await wl.measure_all("http", wl.select(wl.http_scenarios(), only), bench, log))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counts", default="{}", help="JSON object of _workload.Counts fields")
    parser.add_argument("--transports", default="inproc,http")
    parser.add_argument("--only", default="", help="comma list of scenario names (default: all)")
    args = parser.parse_args()
    # 0.3 logs every request at INFO; that would cost the peer time agl does not spend.
    logging.basicConfig(level=logging.WARNING)
    counts = wl.Counts(**json.loads(args.counts))
    import agentlightning

    log(f"agentlightning {getattr(agentlightning, '__version__', '?')} on Python {sys.version.split()[0]}")
    results = asyncio.run(run(counts, args.transports.split(","), [n for n in args.only.split(",") if n] or None))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
