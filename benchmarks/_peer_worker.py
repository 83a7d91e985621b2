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
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, AsyncIterator, Dict, Iterator, List

import _workload as wl

# agentlightning imports litellm, which otherwise spends the first seconds of the run (and
# a core) retrying a download of its cost map from a host this machine cannot reach.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from agentlightning.store import InMemoryLightningStore, LightningStoreClient  # noqa: E402
from agentlightning.types import EnqueueRolloutRequest, Span  # noqa: E402

# Seconds to wait for the peer server's /health; it imports litellm and fastapi first.
SERVER_START_TIMEOUT_S = 120.0


class PeerKit:
    """agent-lightning 0.3 spans: OpenTelemetry-typed attributes (see `_workload.otel_flat`)."""

    def span(self, fields: Dict[str, Any]) -> Any:
        return Span(**{**fields, "attributes": wl.otel_flat(fields["attributes"])})

    def enqueue_request(self, input: Any) -> Any:
        return EnqueueRolloutRequest(input=input)


def log(message: str) -> None:
    print(f"peer: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def in_process_store() -> AsyncIterator[Any]:
    yield InMemoryLightningStore(thread_safe=True)


@contextlib.contextmanager
def peer_server() -> Iterator[str]:
    """0.3's `agl store` on a free 127.0.0.1 port, in its own process; yields its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentlightning.cli.store", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"peer store server exited with {proc.returncode} before it was healthy")
            try:
                with urllib.request.urlopen(url + "/v1/agl/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"peer store server not healthy after {SERVER_START_TIMEOUT_S:.0f}s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def http_store_factory(url: str) -> Any:
    @contextlib.asynccontextmanager
    async def client() -> AsyncIterator[Any]:
        # No retries: a failing request should fail the run, not be hidden in its time.
        store = LightningStoreClient(url, retry_delays=(), health_retry_delays=())
        try:
            yield store
        finally:
            await store.close()

    return client


async def run(counts: wl.Counts, transports: List[str]) -> Dict[str, Any]:
    kit = PeerKit()
    payloads = wl.payload_pool()
    results: Dict[str, Any] = {}
    if "inproc" in transports:
        for name, scenario in wl.span_scenarios().items():
            key = f"inproc.{name}"
            results[key] = await wl.measure(key, scenario, in_process_store, kit, payloads, counts, log)
    if "http" in transports:
        with peer_server() as url:
            factory = http_store_factory(url)
            scenarios = {**wl.span_scenarios(), "runners": wl.runner_scenario()}
            for name, scenario in scenarios.items():
                key = f"http.{name}"
                results[key] = await wl.measure(key, scenario, factory, kit, payloads, counts, log)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counts", default="{}", help="JSON object of _workload.Counts fields")
    parser.add_argument("--transports", default="inproc,http")
    args = parser.parse_args()
    # 0.3 logs every request at INFO; that would cost the peer time agl does not spend.
    logging.basicConfig(level=logging.WARNING)
    counts = wl.Counts(**json.loads(args.counts))
    import agentlightning

    log(f"agentlightning {getattr(agentlightning, '__version__', '?')} on Python {sys.version.split()[0]}")
    results = asyncio.run(run(counts, args.transports.split(",")))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
