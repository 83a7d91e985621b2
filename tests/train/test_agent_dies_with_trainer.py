"""An agent started by the local runner ends with the process that started it, even a SIGKILLed one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from .conftest import REPO_ROOT
from .test_local_runner import process_gone

PATIENCE_S = 30.0  # bounds a broken test only


def wait_until(done, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not done():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def test_an_agent_dies_when_its_trainer_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "agent.pid"
    agent = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    # The "trainer": a process whose runner starts the agent, then waits on it.
    trainer = textwrap.dedent(
        f"""
        import asyncio, sys
        from agl_train.runner.local import run_process
        asyncio.run(run_process([sys.executable, "-c", {agent!r}], {{}}, timeout_s=120))
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", trainer], cwd=REPO_ROOT, env={**os.environ})
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), "the agent to start")
        agent_pid = int(pid_file.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_until(lambda: process_gone(agent_pid), f"agent {agent_pid} to die with its trainer")
    finally:
        parent.kill()
        parent.wait()
