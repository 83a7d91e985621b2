"""`create_app(store)`: the Starlette app that serves a LightningStore over HTTP."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Dict, Optional

from starlette.applications import Starlette
from starlette.middleware import Middleware

from ..base import LightningStore
from . import otlp
from .auth import BearerKeyMiddleware
from .limits import BodySizeLimitMiddleware
from .metrics import MetricsMiddleware, ServerMetrics
from .routes import all_routes
from .routes.system import HEALTH_PATHS

logger = logging.getLogger("agl_store.server")

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""Large enough for a batch of thousands of LLM-call spans with their token ids."""


def create_app(
    store: LightningStore,
    *,
    key: Optional[str] = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    manage_store: bool = True,
) -> Starlette:
    """An ASGI app serving `store` at the agent-lightning 0.3 routes plus agl's additions.

    With `manage_store`, the app opens the store (when it has an `open()`) at startup and
    closes it at shutdown. `key` turns on bearer-key auth for everything but the health
    checks. Bodies over `max_body_bytes` are refused with 413.
    """
    metrics = ServerMetrics()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[Dict[str, Any]]:
        if manage_store:
            opener = getattr(store, "open", None)
            if opener is not None:
                await opener()
        logger.info("store server started (%s)", store.name)
        try:
            yield {"store": store, "metrics": metrics}
        finally:
            if manage_store:
                await store.close()
            logger.info("store server stopped")

    middleware = [Middleware(MetricsMiddleware, metrics=metrics)]  # outermost: also counts 401 and 413
    if key:
        middleware.append(Middleware(BearerKeyMiddleware, key=key, open_paths=HEALTH_PATHS))
    middleware.append(Middleware(BodySizeLimitMiddleware, max_bytes=max_body_bytes))
    return Starlette(routes=[*all_routes(), *otlp.routes()], middleware=middleware, lifespan=lifespan)
