"""Run vLLM's OpenAI-compatible server on the tiny model as a subprocess on 127.0.0.1.

One server costs about a minute of start-up and most of a CPU core while it generates, so the test suite
shares one per session (``tests/conftest.py``). ``python -m examples.tiny_vllm.vllm_server`` serves it until
Ctrl-C or SIGTERM. From code::

    with running_vllm_server(build_tiny_model(), log_path=Path("vllm.log")) as server:
        print(server.base_url)  # http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from agl_train.verl_glue.verl_config import default_tool_call_parser, tool_call_cli_args

from .real_vocab import QWEN2_5, Flavour, is_real_vocab_built
from .tiny_model import DEFAULT_DIR, SERVED_MODEL_NAME, is_built

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
# Flags checked on a 2-core CPU machine: float32 because CPU kernels want it, eager because graph capture
# is slow and pointless here, a 64 MiB KV cache so start-up does not reserve most of the RAM. Tool calling is
# turned on as agl's trainer turns it on in verl's servers (agentlightning.tool_call_parser, same function).
VLLM_FLAGS = (
    "--enforce-eager",
    "--dtype", "float32",
    "--max-model-len", "512",
    "--kv-cache-memory-bytes", str(64 * 1024 * 1024),
    "--max-num-seqs", "8",
    "--seed", "0",
    *tool_call_cli_args(default_tool_call_parser()),
)  # fmt: skip


class VLLMServerError(RuntimeError):
    """The vLLM server exited or did not become ready; the message ends with its log tail."""


@dataclass(frozen=True)
class VLLMServer:
    """A running tiny vLLM server: what a test needs to talk to it."""

    base_url: str  # http://127.0.0.1:PORT/v1
    model: str  # the served model name, to put in requests
    model_path: Path
    tokenizer_path: Path
    log_path: Path | None  # None for a server this process did not start
    pid: int | None

    @property
    def root_url(self) -> str:
        """The server without the ``/v1`` suffix (for ``/health``, ``/tokenize``, ...)."""
        return self.base_url.removesuffix("/v1")


def external_vllm_server(base_url: str, model_path: Path, model: str = SERVED_MODEL_NAME) -> VLLMServer:
    """Describe a tiny vLLM started elsewhere (it must serve ``model_path`` under ``model``)."""
    base_url = base_url.rstrip("/")
    if not base_url.endswith("/v1"):
        base_url += "/v1"
    return VLLMServer(base_url, model, model_path, model_path, log_path=None, pid=None)


def build_tiny_model(outdir: Path = DEFAULT_DIR) -> Path:
    """Build the tiny model if needed, in a subprocess so that torch and transformers stay out of the caller."""
    if not is_built(outdir):
        command = [sys.executable, "-m", "examples.tiny_vllm.tiny_model", str(outdir)]
        subprocess.run(command, check=True, cwd=_repo_root())
    return outdir


def build_real_vocab_model(flavour: Flavour = QWEN2_5, outdir: Path | None = None) -> Path:
    """Build a real-vocabulary model (``real_vocab``) if needed, in a subprocess like ``build_tiny_model``."""
    outdir = outdir or flavour.default_dir
    if not is_real_vocab_built(outdir, flavour):
        command = [sys.executable, "-m", "examples.tiny_vllm.real_vocab", "--flavour", flavour.name, str(outdir)]
        subprocess.run(command, check=True, cwd=_repo_root())
    return outdir


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_vllm_server(
    model_path: Path,
    *,
    log_path: Path,
    served_model_name: str = SERVED_MODEL_NAME,
    start_timeout_s: float = START_TIMEOUT_S,
    extra_args: tuple[str, ...] = (),
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[VLLMServer]:
    """Start vLLM on ``model_path``, wait until it serves ``/v1/models``, yield it, then stop it.

    ``extra_env`` adds environment variables (e.g. ``VLLM_SERVER_DEV_MODE=1`` for the weight-reload endpoints).

    Raises VLLMServerError (with the log tail) if the server dies or is not ready within ``start_timeout_s``.
    """
    port = free_port()
    command = vllm_command(model_path, port, served_model_name, extra_args)
    env = {
        **os.environ,
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **(extra_env or {}),
    }
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        # A new session makes the server and the engine processes it forks one process group to stop.
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    server = VLLMServer(
        base_url=f"http://127.0.0.1:{port}/v1",
        model=served_model_name,
        model_path=model_path,
        tokenizer_path=model_path,
        log_path=log_path,
        pid=process.pid,
    )
    try:
        _wait_until_ready(process, server, start_timeout_s)
        yield server
    finally:
        _stop(process)


def vllm_command(model_path: Path, port: int, served_model_name: str, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The command line of a tiny vLLM server on 127.0.0.1:``port``."""
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_path),
        "--served-model-name", served_model_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        *VLLM_FLAGS,
        *extra_args,
    ]  # fmt: skip


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the test process dies, even by SIGKILL (Linux only).

    Without it a killed pytest would leave a vLLM server (in its own session) running on a shared machine;
    vLLM's engine processes exit when their API server does.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _wait_until_ready(process: subprocess.Popen[bytes], server: VLLMServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise VLLMServerError(f"vLLM exited with code {process.returncode}\n{log_tail(server.log_path)}")
        try:
            with urllib.request.urlopen(f"{server.base_url}/models", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1.0)
    raise VLLMServerError(f"vLLM not ready after {timeout_s:.0f} s\n{log_tail(server.log_path)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (vLLM shuts its engine down on it), SIGKILL if it hangs."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    # Engine processes may outlive the API server by a moment; make sure none is left.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def log_tail(log_path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of the server log, for error messages."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def main() -> int:
    """Serve the tiny model until interrupted (for AGL_TEST_VLLM_BASE_URL while iterating on tests)."""
    log_path = Path(tempfile.gettempdir()) / f"agl-tiny-vllm-{os.getpid()}.log"
    # The server runs in its own session, so it must be stopped by us: turn SIGTERM into a clean exit.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with running_vllm_server(build_tiny_model(), log_path=log_path) as server:
        print(f"export AGL_TEST_VLLM_BASE_URL={server.base_url}  # log: {log_path}; Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
