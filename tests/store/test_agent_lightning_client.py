"""agent-lightning 0.3's own `LightningStoreClient` against a real `agl store serve`.

The client runs in the peer venv (`benchmarks/_peers.py` makes it; `scripts/test.sh` does so
before pytest) because its pins differ from agl's; `agent_lightning_client.py` drives the
client's whole surface and prints what it saw. Run against agent-lightning 0.3's own server,
the script sees the same, except where docs/store.md lists a deliberate difference (marked
below). In CI a missing peer venv fails the test instead of skipping it.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from benchmarks._peers import peer_python

from .http_server import start_store_server

PEER_PYTHON = peer_python()
SCRIPT = Path(__file__).with_name("agent_lightning_client.py")

EXPECTED = {
    "resources": {
        "versions": [1, 1, 2],
        "latest": "rs-prompt",
        "by_id": "http://llm/v1",
        "query_total": 2,
        "missing": None,
    },
    # Enqueued without resources_id: the latest resources (the explicit one is kept).
    "enqueued": [["queuing", "prompt"], ["queuing", "prompt"], ["queuing", "llm"]],
    "dequeued": [True, [1, 1]],
    "empty_queue": None,
    # Sequence ids for the attempt, for "latest" and for an attempt the store has not seen.
    "sequence_ids": [1, 2, 3, 4, 5],
    "spans_added": {
        "one": 1,
        # Difference: 0.3's server answers 500 to a span sent with attempt_id "latest"; agl stores it
        # under the latest attempt. sequence_id 0 is kept as sent.
        "latest_with_zero": [True, 0],
        "batch": [9, 9],
        "otel": ["agent.step", True, 10, list(range(10))],
        "duplicate": None,
    },
    "spans": [["reward", 0], ["openai.chat", 1], ["tool-0", 9], ["tool-1", 9], ["agent.step", 10]],
    "span_page": [["tool-1", "tool-0"], 5],
    "null_metadata": 400,
    "attempt_update": [{"gpu": 0}, 5.0, "running"],
    "succeeded": ["succeeded", "succeeded"],
    "waited": [True],  # the unknown id is not waited for
    # A new attempt of a succeeded rollout; difference: agl clears the rollout's end_time, 0.3 keeps it.
    "start_attempt_on_succeeded": ["preparing", 2, True],
    "attempts": [[1, 2], "preparing"],
    "requeue_failed": ["failed", "requeuing", True, 2],
    "start_rollout": ["preparing", "rs-prompt", 1],
    "query_rollouts": [4, 4, True],
    "missing_rollout": [None, None],
    "workers": [{"load": 1}, "idle", ["w1", "w2", "w3", "w4"], "w5"],
    "enqueue_without_rollouts": 422,
    "bad_sort_by": [400, "Invalid sort_by: nonsense"],
    "statistics": [4, 6, 5, "SQLiteStore"],
}


async def test_agent_lightning_03_client_works_against_our_server(tmp_path: Path) -> None:
    if not PEER_PYTHON.exists():
        reason = f"no agent-lightning 0.3 venv at {PEER_PYTHON}; scripts/test.sh (or benchmarks/_peers.py) makes it"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    # The peer imports only from its own venv.
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    async with start_store_server(tmp_path / "store.db") as store:
        peer = await asyncio.create_subprocess_exec(
            str(PEER_PYTHON),
            str(SCRIPT),
            store.url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        out, err = await peer.communicate()
    assert peer.returncode == 0, err.decode()[-3000:]
    assert json.loads(out.decode().strip().splitlines()[-1]) == EXPECTED
