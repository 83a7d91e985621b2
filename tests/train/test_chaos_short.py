"""The chaos run's short form (benchmarks/chaos_run.py): three steps of the word_lookup example
on the CPU, with the store server, the proxy and vLLM as processes of their own, during which one
agent, the store server (restarted on the same port and file) and the trainer itself are killed
(SIGKILL; the trainer is started again with the same command). The run completes every step, no
group is trained twice, no rollout has two attempts running at once, every succeeded rollout has
its spans, no agent outlives its trainer, and no span the store acknowledged is lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.training, pytest.mark.vllm]


def test_a_run_survives_a_killed_agent_store_server_and_trainer(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.chaos_run", "--steps", "3", "--faults", "agent,store,trainer"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "chaos"), "--timeout", "1200"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    report = json.loads(done.stdout[done.stdout.index("{") :])
    assert report["completed"] and report["steps_checkpointed"] == [1, 2, 3], done.stderr[-3000:]
    assert report["launches"] >= 2  # the killed trainer resumed
    assert all(fault["fired_at"] is not None for fault in report["faults"])
    assert not any(report["checks"].values()), report["checks"]
