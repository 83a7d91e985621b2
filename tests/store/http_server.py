"""Run `agl store serve` as a real subprocess on 127.0.0.1 for tests.

    async with start_store_server(tmp_path / "store.db") as store:
        await store.enqueue_rollout(input={"q": 1})   # a LightningStoreClient

`StoreServerProcess` is the lower-level handle for tests that kill and restart the server;
`serving_store_app` serves the same app from this process and event loop (uvicorn on 127.0.0.1), for the
contract's hundreds of tests, where a process start each would cost a minute.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn

from agl_store.client import LightningStoreClient
from agl_store.server import create_app
from agl_store.sqlite import SQLiteStore
from agl_store.web.serving import bind_socket, start_uvicorn

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
REPO_ROOT = Path(__file__).resolve().parents[2]


class StoreServerProcess:
    """One `python -m agl_store.cli store serve` subprocess on a free port."""

    def __init__(
        self,
        db: str | Path,
        key: str | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.db = str(db)
        self.key = key
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})
        self.url = ""
        self.output: list[str] = []
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Start the server, wait until it answers /health, and return its base URL."""
        args = [sys.executable, "-m", "agl_store.cli", "store", "serve", "--db", self.db, "--port", "0"]
        if self.key:
            args += ["--key", self.key]
        env = {
            **os.environ,
            **self.env,
            "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        self._process = await asyncio.create_subprocess_exec(
            *args, *self.extra_args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env
        )
        announced = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read_output(announced))
        try:
            self.url = await asyncio.wait_for(announced, START_TIMEOUT_S)
        except (TimeoutError, RuntimeError) as exc:
            await self.kill()
            raise RuntimeError(f"store server did not start: {exc}; output:\n" + "\n".join(self.output)) from exc
        async with LightningStoreClient(self.url, timeout=5.0, retries=20, backoff_max=0.2) as probe:
            if not await probe.health():
                raise RuntimeError("store server announced itself but /health failed")
        return self.url

    async def _read_output(self, announced: asyncio.Future[str]) -> None:
        assert self._process is not None and self._process.stdout is not None
        async for raw in self._process.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.output.append(line)
            if not announced.done() and "listening on " in line:
                announced.set_result(line.split("listening on ", 1)[1].split()[0])
        if not announced.done():
            announced.set_exception(RuntimeError(f"server exited with code {await self._process.wait()}"))

    async def stop(self) -> int:
        """Stop gracefully (SIGTERM) and return the exit code."""
        return await self._end(signal.SIGTERM)

    async def interrupt(self) -> int:
        """SIGINT, as Ctrl-C in a terminal sends; returns the exit code."""
        return await self._end(signal.SIGINT)

    async def kill(self) -> int:
        """SIGKILL: the server gets no chance to flush or close anything."""
        return await self._end(signal.SIGKILL)

    async def _end(self, sig: int) -> int:
        process = self._process
        if process is None:
            return 0
        if process.returncode is None:
            process.send_signal(sig)
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._reader is not None:
            await self._reader
        self._process = None
        return process.returncode if process.returncode is not None else 0


@asynccontextmanager
async def start_store_server(db_path: str | Path, key: str | None = None) -> AsyncIterator[LightningStoreClient]:
    """Start a real store server on `db_path` and yield an opened client; stop both after."""
    server = StoreServerProcess(db_path, key=key)
    await server.start()
    client = LightningStoreClient(server.url, key=key)
    await client.open()
    try:
        yield client
    finally:
        await client.close()
        await server.stop()


@asynccontextmanager
async def serving_store_app(db_path: str | Path) -> AsyncIterator[LightningStoreClient]:
    """`agl store serve`'s app on `db_path` (its default watchdog, no pages), served by uvicorn in this event
    loop; yields an opened client."""
    app = create_app(SQLiteStore(str(db_path)), pages=False)
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", access_log=False, log_level="warning"))
    task = await start_uvicorn(server, sock, timeout_s=START_TIMEOUT_S)
    try:
        async with LightningStoreClient(f"http://127.0.0.1:{sock.getsockname()[1]}") as client:
            yield client
    finally:
        server.should_exit = True
        await task
        sock.close()
