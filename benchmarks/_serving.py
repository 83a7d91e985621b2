"""A store server in its own process for the length of a `with` block.

Stdlib only: used by `store_bench.py` for agl's server and by `_peer_worker.py`, inside
the peer's venv, for agent-lightning 0.3's.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

HEALTH_PATH = "/v1/agl/health"
"""Both servers answer here (agent-lightning 0.3's route, which agl keeps)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + HEALTH_PATH, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def served(
    command: Callable[[int], list[str]],
    start_timeout_s: float,
    log_path: Path | None = None,
    cwd: Path | None = None,
) -> Iterator[tuple[str, int]]:
    """Start `command(port)` on a free 127.0.0.1 port, wait for its health route, yield
    (url, pid), and stop it (SIGTERM, then SIGKILL after 15 s) when the block ends.

    The server's output goes to `log_path` (discarded when None); its tail is in the
    RuntimeError raised when the server dies or stays unhealthy.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log_path, "wb")) if log_path else subprocess.DEVNULL
        proc = subprocess.Popen(command(port), stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:] if log_path else ""
                state = (
                    f"exited {proc.returncode}"
                    if proc.poll() is not None
                    else f"unhealthy after {start_timeout_s:.0f}s"
                )
                raise RuntimeError(f"server {command(port)[:4]} {state}\n{tail}")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
