"""Serving an ASGI app with uvicorn through its public API only (`agl store serve`, `agl view`, the proxy).

The socket is bound before the server starts, so a taken port fails at once with a clear
line and port 0 reads the chosen port from the socket; the command prints one line when it
listens and one when it stops; SIGINT / SIGTERM stop it gracefully and a second signal skips
the graceful wait.

uvicorn installs its own SIGINT / SIGTERM handlers while it serves from the main thread (and
re-raises a caught signal when it is done). `start_uvicorn` gives the signals back to the
handlers the caller had as soon as the server listens, so a caller's `loop.add_signal_handler`
(or a notebook's Ctrl-C) keeps its meaning while the server runs in the background.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (0 picks a free port); raises OSError when it is taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def start_uvicorn(server: Any, sock: socket.socket, *, timeout_s: float | None = None) -> asyncio.Task[None]:
    """Run `server.serve(sockets=[sock])` (a `uvicorn.Server`) as a task; returns it once the server listens.

    The SIGINT / SIGTERM handlers the caller had are put back once uvicorn has installed its
    own; install yours before calling this, since uvicorn puts back the ones it found when the
    server stops (a signal caught while starting stops the server and is re-raised then). Raises
    RuntimeError when the server stops before listening (the cause attached) or
    does not listen within `timeout_s`; stop it with `server.should_exit = True` and await the task.
    """
    callers = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    task = asyncio.create_task(server.serve(sockets=[sock]), name="agl-uvicorn")
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    while not server.started:
        if task.done():
            error = None if task.cancelled() else task.exception()
            raise RuntimeError("the server stopped before it listened") from error
        if deadline is not None and loop.time() > deadline:
            server.should_exit = True
            await asyncio.gather(task, return_exceptions=True)
            raise RuntimeError(f"the server did not listen within {timeout_s:g} s")
        await asyncio.sleep(0.01)
    for sig, handler in callers.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)
    return task


async def serve_app(app: ASGIApp, *, name: str, host: str, port: int, describe: str) -> int:
    """Serve `app` on `host:port` (0 picks a free port) until a signal; returns the exit code.

    `name` starts every line printed (`agl store serve: listening on ...`); `describe` is
    added in parentheses to the listening line.
    """
    import uvicorn

    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        print(f"{name}: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    bound_host, bound_port = sock.getsockname()[:2]
    config = uvicorn.Config(app, lifespan="on", access_log=False, log_level="warning", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    loop = asyncio.get_running_loop()
    # Installed before uvicorn starts, so that these are the handlers it gives back and the
    # signal it re-raises when done lands here instead of killing the command before its clean-up.
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, _exit_requester(server))
    try:
        try:
            task = await start_uvicorn(server, sock)
        except RuntimeError as exc:
            print(f"{name}: cannot start: {exc.__cause__ or exc}", file=sys.stderr)
            return 1
        print(f"{name}: listening on http://{bound_host}:{bound_port} ({describe})", flush=True)
        await task
    finally:
        for sig in _STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        sock.close()
    print(f"{name}: stopped", flush=True)
    return 0


def _exit_requester(server: Any) -> Callable[[], None]:
    """A signal callback: the first signal stops `server` gracefully, the next skips the graceful wait."""

    def request_exit() -> None:
        if server.should_exit:
            server.force_exit = True
        server.should_exit = True

    return request_exit
