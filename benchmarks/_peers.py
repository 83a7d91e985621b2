"""The agent-lightning 0.3 peer: its own virtual environment and its worker process.

The peer must not share agl's interpreter (its pins of litellm, pydantic and fastapi differ
from ours), so it lives in a separate venv under `.cache/peers/`, created on first use.
Everything here degrades to a clear "skipped because ..." message instead of failing the
benchmark: a machine without the registry still gets agl's numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PEER_PACKAGE = "agentlightning"
PEER_VERSION = "0.3.0"
BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_CACHE_DIR = REPO_ROOT / ".cache" / "peers"
WORKER_SCRIPT = BENCH_DIR / "_peer_worker.py"
# pip on 2 busy cores with litellm[proxy] in the closure takes minutes; past this it is stuck.
INSTALL_TIMEOUT_S = 1800.0
# The uv that scripts/setup.sh installs (scripts/test.sh passes it on): it installs the peer's closure
# faster than pip. Without it, pip.
UV_ENV = "AGL_UV"
PEER_REQUIREMENTS = REPO_ROOT / "requirements" / "peer-agentlightning.txt"
"""The peer's whole closure at exact versions (`uv pip freeze` of a resolved venv), installed without resolving."""

Log = Callable[[str], None]


@dataclass(frozen=True)
class PeerEnv:
    """A ready peer venv: `python` imports `agentlightning` at `version`."""

    python: Path
    version: str


@dataclass(frozen=True)
class PeerUnavailable:
    """Why the peer cannot run on this machine; printed instead of its numbers."""

    reason: str


def peer_venv_dir(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    return cache_dir / f"{PEER_PACKAGE}-{PEER_VERSION.rsplit('.', 1)[0]}"


def _venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def peer_python(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The peer venv's interpreter; it exists once `ensure_peer` has made the venv."""
    return _venv_python(peer_venv_dir(cache_dir))


def _installed_version(python: Path) -> str | None:
    """The peer package's version inside the venv, or None when it does not import."""
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version('{PEER_PACKAGE}'))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def _stream(cmd: Sequence[str], log: Log, timeout_s: float) -> int:
    """Run `cmd`, forwarding its output as progress lines; the exit status (124 on timeout)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = line.rstrip()
            # pip's per-file chatter would bury the useful lines; keep the milestones (pip's and uv's).
            milestones = ("Collecting", "Successfully", "ERROR", "error", "Resolved", "Installed")
            if line.lstrip().startswith(milestones) or "Installing collected" in line:
                log(f"  install: {line[:160]}")
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return 124


def ensure_peer(cache_dir: Path = DEFAULT_CACHE_DIR, log: Log = print) -> PeerEnv | PeerUnavailable:
    """Create (once) the peer venv with `agentlightning==0.3.0` and return it.

    Reuses a venv where the package already imports at the right version. Install
    failures (no registry, no wheel for this Python) come back as `PeerUnavailable`.
    """
    venv_dir = peer_venv_dir(cache_dir)
    python = _venv_python(venv_dir)
    version = _installed_version(python)
    if version == PEER_VERSION:
        return PeerEnv(python=python, version=version)

    uv = os.environ.get(UV_ENV)
    installer = "uv" if uv and Path(uv).is_file() else "pip"
    log(f"peer: creating {venv_dir} with {PEER_PACKAGE}=={PEER_VERSION} ({installer}; first run only)")
    try:
        if not python.exists():
            venv.EnvBuilder(with_pip=installer == "pip", clear=True).create(venv_dir)
    except (OSError, subprocess.CalledProcessError) as exc:
        return PeerUnavailable(f"could not create a venv at {venv_dir}: {exc}")
    pins = ["--no-deps", "-r", str(PEER_REQUIREMENTS)]
    if installer == "uv":
        command = [str(uv), "pip", "install", "--python", str(python), *pins]
    else:
        command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *pins]
    status = _stream(command, log, INSTALL_TIMEOUT_S)
    if status != 0:
        return PeerUnavailable(
            f"{installer} install -r {PEER_REQUIREMENTS.name} failed (exit {status}); see the installer's lines above"
        )
    version = _installed_version(python)
    if version != PEER_VERSION:
        return PeerUnavailable(f"{PEER_PACKAGE} does not import in {venv_dir} after install (found {version!r})")
    log(f"peer: ready ({PEER_PACKAGE} {version})")
    return PeerEnv(python=python, version=version)


def run_peer_worker(peer: PeerEnv, args: list[str], log: Log = print, timeout_s: float = 1800.0) -> dict[str, Any]:
    """Run `_peer_worker.py` in the peer venv and return the JSON object it prints last.

    The worker's stderr carries its progress lines, forwarded through `log`. Raises
    `RuntimeError` with the worker's last words when it fails.
    """
    env = dict(os.environ)
    # The peer must not see agl's venv or sources: its imports resolve in its own venv only.
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.Popen(
        [str(peer.python), str(WORKER_SCRIPT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(BENCH_DIR),
    )
    assert proc.stderr is not None and proc.stdout is not None
    tail: list[str] = []
    for line in proc.stderr:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        if line.startswith("peer"):
            log(f"  {line}")
    out = proc.stdout.read()
    status = proc.wait(timeout=timeout_s)
    if status != 0:
        raise RuntimeError(f"peer worker exited {status}:\n" + "\n".join(tail))
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if not lines:
        raise RuntimeError("peer worker printed no result:\n" + "\n".join(tail))
    return json.loads(lines[-1])


if __name__ == "__main__":
    # `python benchmarks/_peers.py` prepares the peer venv ahead of a benchmark run.
    result = ensure_peer()
    print(result)
    sys.exit(0 if isinstance(result, PeerEnv) else 1)
