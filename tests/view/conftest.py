"""Fixtures of the view's tests: a SQLite store on a file, served with the view on a real port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agl_store.server import create_app
from agl_store.sqlite import SQLiteStore
from tests.proxy.helpers import serve


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    async with SQLiteStore(str(tmp_path / "agl.db")) as opened:
        yield opened


@pytest.fixture
async def store_url(store: SQLiteStore) -> AsyncIterator[str]:
    """The store server (store routes and the view found through its entry point) on 127.0.0.1."""
    async with serve(create_app(store, manage_store=False)) as url:
        yield url


@pytest.fixture
def encode(tokenizer: Any) -> Callable[[str], list[int]]:
    """Text → token ids of the tiny model, special tokens included (as a chat template renders them)."""
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False))
