"""Serving an ASGI app with uvicorn's public API: the caller keeps its signal handlers."""

from __future__ import annotations

import signal
import socket

import httpx
import pytest
import uvicorn

from agl_store.web.serving import bind_socket, start_uvicorn


async def hello(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


async def test_a_started_server_answers_and_leaves_sigint_and_sigterm_to_the_caller() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(hello, log_level="warning", lifespan="on"))
    task = await start_uvicorn(server, sock)
    try:
        # uvicorn installs its own handlers while it serves; a notebook's Ctrl-C must still reach the notebook.
        assert {sig: signal.getsignal(sig) for sig in before} == before
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"http://127.0.0.1:{sock.getsockname()[1]}/")
        assert answer.text == "hello"
    finally:
        server.should_exit = True
        await task
        sock.close()
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_taken_port_fails_when_bound() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            bind_socket("127.0.0.1", taken.getsockname()[1])
