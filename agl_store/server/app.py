"""`create_app(store)`: the Starlette app that serves a LightningStore over HTTP."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from ..base import LightningStore
from ..http_paths import AGL_PREFIX
from ..span_wire import PACKED_MEDIA_TYPE
from ..web.auth import BearerKeyMiddleware
from ..web.cross_site import CrossSiteGuard, is_loopback
from ..web.wire import http_error_response
from . import otlp
from .limits import BodySizeLimitMiddleware
from .metrics import MetricsMiddleware, ServerMetrics
from .pages import PageSettings, discover_pages
from .routes import all_routes
from .routes.system import HEALTH_PATHS

logger = logging.getLogger("agl_store.server")

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""Large enough for a batch of thousands of LLM-call spans with their token ids."""

OWN_MEDIA_TYPES = {
    "/v1/traces": None,  # the OTLP route takes protobuf or JSON and refuses the rest itself
    "/v1/logs": None,  # answers 501 to any body
    f"{AGL_PREFIX}/spans/batch/packed": (PACKED_MEDIA_TYPE,),
}
"""Write routes whose bodies are not JSON (or not only): the types they take instead."""


def create_app(
    store: LightningStore,
    *,
    key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    manage_store: bool = True,
    pages: bool = True,
    page_settings: PageSettings | None = None,
    host: str = "127.0.0.1",
) -> Starlette:
    """An ASGI app serving `store` at the agent-lightning 0.3 routes plus agl's additions.

    With `manage_store`, the app opens the store at startup and closes it at shutdown.
    `key` turns on bearer-key auth for everything but the health checks. Bodies over
    `max_body_bytes` are refused with 413. With `pages`, the routes of the
    `agl.store_pages` entry points (the web view at `/`) are served too; their shells are
    open without the key, listed in `app.state.open_paths` for apps that mount this one;
    each plug-in receives its entry of `page_settings` (ValueError when one refuses them).
    `host` is the address the app is served on: without a key on a loopback address, only
    loopback `Host` names are answered (`agl_store.web.cross_site` has every check against web pages).
    """
    metrics = ServerMetrics()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        if manage_store:
            await store.open()
        logger.info("store server started (%s)", store.name)
        try:
            # The metrics key is namespaced: an app that mounts this one merges this state into its own.
            yield {"store": store, "agl_store_metrics": metrics}
        finally:
            if manage_store:
                await store.close()
            logger.info("store server stopped")

    page_routes, page_paths = discover_pages(page_settings) if pages else ([], frozenset())
    open_paths = frozenset(HEALTH_PATHS) | page_paths
    middleware = [
        Middleware(MetricsMiddleware, metrics=metrics),  # outermost: also counts 401, 403, 413 and 415
        Middleware(CrossSiteGuard, keyless=not key, loopback=is_loopback(host), media_types=OWN_MEDIA_TYPES),
    ]
    if key:
        middleware.append(Middleware(BearerKeyMiddleware, key=key, open_paths=open_paths))
    middleware.append(Middleware(BodySizeLimitMiddleware, max_bytes=max_body_bytes))
    app = Starlette(
        routes=[*all_routes(), *otlp.routes(max_body_bytes), *page_routes],
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error_response},
    )
    app.state.open_paths = open_paths
    return app
