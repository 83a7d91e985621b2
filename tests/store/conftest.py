"""The `store` fixture: one contract, every backend.

Each test that takes `store` runs three times: an in-memory SQLiteStore, an SQLiteStore on
a file in `tmp_path`, and a LightningStoreClient talking over HTTP to `agl store serve`'s app on
that file, served by uvicorn in the test's event loop (tests/store/test_cli.py and the others that
use `start_store_server` run the real subprocess). Embedded stores scan for unhealthy attempts
every 50 ms; the served one runs its default watchdog, so tests wait on outcomes, never on durations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agl_store.base import LightningStore
from agl_store.sqlite import SQLiteStore

from .http_server import serving_store_app

FAST_WATCHDOG_S = 0.05


@pytest.fixture(params=["memory", "sqlite", "http"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LightningStore]:
    if request.param == "http":
        async with serving_store_app(tmp_path / "store.db") as client:
            yield client
        return
    path = ":memory:" if request.param == "memory" else str(tmp_path / "store.db")
    async with SQLiteStore(path, watchdog_interval=FAST_WATCHDOG_S, poll_interval=FAST_WATCHDOG_S) as opened:
        yield opened
