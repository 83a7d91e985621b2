"""The processes a CPU run starts beside the trainer: vLLM serving a copy of the model, `agl proxy serve`.

Both are subprocesses (agl_train never imports agl_proxy); each is stopped when its `with` ends, and
killed by the kernel when the process that started it dies (`die_with_parent`), so a killed `agl train`
(Ctrl-C twice, the OOM killer) leaves no server behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ..runner.local import die_with_parent
from ..verl_glue.verl_config import default_tool_call_parser, scale_out_server_arg, tool_call_cli_args

PROXY_START_TIMEOUT_S = 60.0
VLLM_START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 30.0
# Checked on a 2-core CPU machine: float32 for the CPU kernels, eager (graph capture is slow and
# pointless here), a 64 MiB KV cache so that start-up does not reserve most of the memory.
CPU_VLLM_FLAGS = (
    "--enforce-eager",
    "--dtype", "float32",
    "--max-model-len", "1024",
    "--kv-cache-memory-bytes", str(64 * 1024 * 1024),
    "--max-num-seqs", "16",
    "--seed", "0",
)  # fmt: skip


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set `values` in `os.environ` (inherited by the agents and verl's loggers), restored on exit."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def running_proxy(out: Path, cwd: Path | None = None) -> Iterator[str]:
    """`agl proxy serve` with no backend (the trainer registers vLLM), its embedded store in
    `out/agl.db` and the web view, logging the sampled tokens' logprobs; yields its URL."""
    (out / "models.yaml").write_text("model_list: []\n")
    log_path = out / "proxy.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "agl_store.cli", "proxy", "serve", "--config", str(out / "models.yaml"),
             "--db", str(out / "agl.db"), "--port", "0", "--logprobs"],
            stdout=log, stderr=subprocess.STDOUT, cwd=cwd, preexec_fn=die_with_parent(os.getpid()),
        )  # fmt: skip
    try:
        yield _wait_for_listening(process, log_path)
    finally:
        _stop(process, group=False)


def _wait_for_listening(process: subprocess.Popen[bytes], log_path: Path) -> str:
    deadline = time.monotonic() + PROXY_START_TIMEOUT_S
    while time.monotonic() < deadline:
        match = re.search(r"listening on (http://\S+)", log_path.read_text(errors="replace"))
        if match:
            return match.group(1)
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"agl proxy serve did not start:\n{log_path.read_text(errors='replace')[-2000:]}")


def vllm_command(model: Path, port: int, extra_args: Sequence[str] = ()) -> list[str]:
    """vLLM's server on the CPU on 127.0.0.1:`port`: agl's tool-call parser, the token-in endpoints of the
    proxy's token chain (`--enable-scale-out`, where this vLLM has it), then `extra_args`."""
    scale_out = ["--enable-scale-out"] if scale_out_server_arg() else []
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port), *CPU_VLLM_FLAGS,
        *tool_call_cli_args(default_tool_call_parser()), *scale_out, *extra_args,
    ]  # fmt: skip


@contextlib.contextmanager
def running_vllm(model: Path, log_path: Path, extra_args: Sequence[str] = ()) -> Iterator[str]:
    """vLLM in dev mode (`VLLM_SERVER_DEV_MODE=1`: the trainer reloads the weights in place) serving `model`,
    which the trainer overwrites: serve a copy. Yields its `host:port` once it answers `/v1/models`."""
    port = _free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1"}
    with open(log_path, "wb") as log:
        # Its own session: the server and the engine processes it forks stop as one group.
        process = subprocess.Popen(
            vllm_command(model, port, extra_args),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent(os.getpid()),  # vLLM's engine processes exit with its server
        )
    try:
        _wait_until_serving(process, f"http://127.0.0.1:{port}/v1/models", log_path)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(process, group=True)


def _wait_until_serving(process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + VLLM_START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        time.sleep(1.0)
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
    raise RuntimeError(f"vLLM did not start (log {log_path}):\n{tail}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(process: subprocess.Popen[bytes], group: bool) -> None:
    """SIGTERM (the process group when `group`), SIGKILL when it hangs."""

    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig) if group else process.send_signal(sig)

    if process.poll() is None:
        send(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            process.wait()
    if group:
        send(signal.SIGKILL)  # engine processes may outlive the server by a moment
