"""Session servers started ahead, on a thread each, and stopped after the last test that uses them.

A vLLM start takes half a minute of one core, and pytest runs its tests on one: started ahead, a session
server's start overlaps pytest's collection (a run of the whole suite starts the servers registered by then at
once) or the tests before the first one that needs it (the others start when collection ends, if a collected
test asks for them). Once the last test that uses it is done, the server stops, leaving its core and memory to
the tests after it. A conftest registers each server under its fixture's name (`register`); the fixture takes
the running server (or waits for the rest of its start) with `get`::

    def pytest_configure(config):
        early_servers(config).register("vllm_server", serve_tiny_vllm)

    @pytest.fixture(scope="session")
    def vllm_server(request):
        return early_servers(request.config).get("vllm_server")

The hooks that start and stop them are those of tests/conftest.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

import pytest

Serve = Callable[[], AbstractContextManager[Any]]


class EarlyServer:
    """`serve()` (a context manager that starts a server and stops it) entered on a thread of its own, once the
    servers in `after` are up (or failed): those that start first are those the first tests need."""

    def __init__(self, name: str, serve: Serve, after: Sequence[EarlyServer] = ()) -> None:
        self._serve = serve
        self._after = after
        self._ready: Future[Any] = Future()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"early-{name}", daemon=True)
        self._thread.start()

    def get(self) -> Any:
        """The server once it serves; raises what its start raised."""
        return self._ready.result()

    def stop(self, wait: bool = True) -> None:
        """Stop the server (or its start); with `wait`, until it is stopped. Calling it again does no harm."""
        self._stop.set()
        if wait:
            self._thread.join()

    def _run(self) -> None:
        for earlier in self._after:  # up, failed or stopped: a failed start is that server's fixture's to report
            while not earlier._ready.done() and not self._stop.wait(0.1):
                pass
        if self._stop.is_set():
            self._ready.set_exception(RuntimeError("stopped before it started"))
            return
        try:
            with self._serve() as server:
                self._ready.set_result(server)
                self._stop.wait()
        except BaseException as exc:
            if self._ready.done():
                raise
            self._ready.set_exception(exc)  # raised in get()


class EarlyServers:
    """The session's servers that may start ahead, by fixture name, those started, and the last test of each."""

    def __init__(self) -> None:
        self._serve: dict[str, tuple[Serve, tuple[str, ...]]] = {}
        self._started: dict[str, EarlyServer] = {}
        self._last_user: dict[str, str] = {}

    def register(self, name: str, serve: Serve, after: Sequence[str] = ()) -> None:
        """`serve` starts the server of fixture `name`, after the servers named in `after` if they start too."""
        self._serve[name] = (serve, tuple(after))

    def start(self, wanted: Collection[str] | None = None) -> None:
        """Start the registered servers whose names are in `wanted` (all with None)."""
        names = list(self._serve) if wanted is None else [name for name in self._serve if name in wanted]
        for name in names:
            self._server(name, names)

    def collected(self, items: Sequence[pytest.Item]) -> None:
        """Start the servers the collected `items` use, stop those started ahead that none uses, and note the
        last item that uses each."""
        users: dict[str, str] = {}
        for item in items:
            for name in getattr(item, "fixturenames", ()):
                if name in self._serve:
                    users[name] = item.nodeid
        for name, server in self._started.items():
            if name not in users:
                server.stop(wait=False)
        self._last_user = users
        self.start(users)

    def finished(self, nodeid: str) -> None:
        """After test `nodeid` (its teardown done): stop the servers no later test uses."""
        for name, last in self._last_user.items():
            if last == nodeid and name in self._started:
                self._started[name].stop(wait=False)

    def get(self, name: str) -> Any:
        """The running server `name`, started now if it was not yet."""
        return self._server(name, ()).get()

    def stop_all(self) -> None:
        for server in self._started.values():
            server.stop()

    def _server(self, name: str, starting: Collection[str]) -> EarlyServer:
        if name not in self._started:
            serve, after = self._serve[name]
            earlier = [self._server(other, starting) for other in after if other in starting or other in self._started]
            self._started[name] = EarlyServer(name, serve, earlier)
        return self._started[name]


_KEY = pytest.StashKey[EarlyServers]()


def early_servers(config: pytest.Config) -> EarlyServers:
    """The session's `EarlyServers`."""
    return config.stash.setdefault(_KEY, EarlyServers())


def tmp_path_factory_of(config: pytest.Config) -> pytest.TempPathFactory:
    """The session's `tmp_path_factory`, for the servers started before any fixture runs (as pytest's own
    fixture finds it)."""
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return factory
