"""Open a LightningStore from a URL: the one place that maps schemes to backends.

- `sqlite:///relative/path.db`, `sqlite:////absolute/path.db` (SQLAlchemy's convention:
  the path is everything after `sqlite:///`): an SQLiteStore on that file;
- `memory://` (also `sqlite://` and `sqlite:///:memory:`): an in-memory SQLiteStore;
- `http://host:port`, `https://...`: a LightningStoreClient of a served store.

A SQLite URL may end in `?deltas=off`: every span stored whole, as before LLM calls were
stored as deltas (`SQLiteStore(deltas=False)`; for comparing, readers see the same spans).
"""

from __future__ import annotations

from .base import LightningStore
from .errors import InvalidInputError

_SQLITE_PREFIX = "sqlite:///"
_MEMORY_URLS = frozenset({"memory://", "memory:", "sqlite://", "sqlite:///:memory:"})


async def open_store(url: str, *, key: str | None = None) -> LightningStore:
    """Create and open the store `url` names; the caller closes it (or uses `async with`).

    `key` is the bearer key of a served store; embedded stores ignore it.
    Raises InvalidInputError for a URL whose scheme is not one of the above.
    """
    from .sqlite import SQLiteStore

    base, deltas = _deltas_option(url)
    if base in _MEMORY_URLS:
        return await SQLiteStore(":memory:", deltas=deltas).open()
    if base.startswith(_SQLITE_PREFIX):
        path = base[len(_SQLITE_PREFIX) :]
        if not path:
            raise InvalidInputError(f"store URL {url!r} names no file; use sqlite:///path/to/store.db")
        return await SQLiteStore(path, deltas=deltas).open()
    scheme = url.split("://", 1)[0] if "://" in url else None
    if scheme in ("http", "https"):
        from .client import LightningStoreClient  # written separately; imported only when used

        client = LightningStoreClient(url, key=key)
        await client.open()
        return client
    if scheme is None:
        raise InvalidInputError(
            f"store URL {url!r} has no scheme; use sqlite:///path.db, memory:// or http://host:port"
        )
    raise InvalidInputError(
        f"unknown store URL scheme {scheme!r} in {url!r}; use sqlite:///path.db, memory:// or http://host:port"
    )


def _deltas_option(url: str) -> tuple[str, bool]:
    """The URL without a trailing `?deltas=on|off`, and that option (on by default)."""
    if url.startswith("http") or "?" not in url:
        return url, True
    base, query = url.rsplit("?", 1)
    if query in ("deltas=on", "deltas=off"):
        return base, query == "deltas=on"
    return url, True  # a file name with a "?" in it


def db_url(db: str) -> str:
    """`--db` as a store URL: URLs pass through, a plain path becomes `sqlite:///path`."""
    if "://" in db:
        return db
    return f"sqlite:///{db}"
