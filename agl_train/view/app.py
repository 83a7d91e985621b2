"""`create_view_app(store_url)`: the view served on its own, in front of any store URL.

    app = create_view_app("http://127.0.0.1:4747", key="secret", settings=ViewSettings(tokenizer="/models/qwen"))

The app opens the store in its lifespan (a `LightningStoreClient` for `http://` URLs, a
SQLite store for `sqlite:///` files) and closes it at shutdown. With `key`, the app asks the
browser for the same bearer key it uses towards the store, so it exposes nothing the store
would not. Without one it guards itself against other web pages as the store server does
(`agl_store.web.cross_site`): a foreign `Origin` is refused, and so, when `host` is a
loopback address, is a `Host` that is not a loopback name (DNS rebinding).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.routing import Route

from agl_store.opening import open_store
from agl_store.web.auth import BearerKeyMiddleware
from agl_store.web.cross_site import CrossSiteGuard, is_loopback

from .routes import OPEN_PATHS, ViewRoutes, ViewSettings

HEALTH_PATH = "/health"


async def _health(request: Any) -> JSONResponse:
    return JSONResponse({"status": "ok"})


def create_view_app(
    store_url: str, *, key: str | None = None, settings: ViewSettings | None = None, host: str = "127.0.0.1"
) -> Starlette:
    """The view of the store at `store_url`; `key` is the store's bearer key and the view's; `host` the
    address the app is served on."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        store = await open_store(store_url, key=key)
        try:
            yield {"store": store}
        finally:
            await store.close()

    middleware = [Middleware(CrossSiteGuard, keyless=not key, loopback=is_loopback(host))]
    if key:
        middleware.append(Middleware(BearerKeyMiddleware, key=key, open_paths=OPEN_PATHS | {HEALTH_PATH}))
    routes = [Route(HEALTH_PATH, _health), *ViewRoutes(settings or ViewSettings()).routes()]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
