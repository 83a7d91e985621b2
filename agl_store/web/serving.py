"""Serving an ASGI app from a command line (`agl store serve`, `agl view`).

The socket is bound before the server starts, so a taken port fails at once with a clear
line; the command prints one line when it listens and one when it stops; SIGINT / SIGTERM
stop it gracefully and a second signal skips the graceful wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from typing import Any, Iterator

from starlette.types import ASGIApp


async def serve_app(app: ASGIApp, *, name: str, host: str, port: int, describe: str) -> int:
    """Serve `app` on `host:port` (0 picks a free port) until a signal; returns the exit code.

    `name` starts every line printed (`agl store serve: listening on ...`); `describe` is
    added in parentheses to the listening line.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        print(f"{name}: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    bound_host, bound_port = sock.getsockname()[:2]
    config = uvicorn.Config(app, lifespan="on", access_log=False, log_level="warning", timeout_graceful_shutdown=5)
    server = _server_class()(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.request_exit)
    announce = asyncio.create_task(
        _announce_when_started(server, f"{name}: listening on http://{bound_host}:{bound_port} ({describe})")
    )
    try:
        await server.serve(sockets=[sock])
    finally:
        announce.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    print(f"{name}: stopped", flush=True)
    return 0 if server.started else 1


def _server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, minus its signal handling: uvicorn re-raises the signal after
        shutting down, which would end the command killed, before its own clean-up ran."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        def request_exit(self) -> None:
            # A second signal while draining skips the graceful wait.
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True

    return Server


async def _announce_when_started(server: Any, line: str) -> None:
    while not server.started:
        await asyncio.sleep(0.01)
    print(line, flush=True)
