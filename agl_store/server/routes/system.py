"""Health, statistics and the Prometheus page."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...web.wire import endpoint, store_of
from ..metrics import PROMETHEUS_MEDIA_TYPE, metrics_of

HEALTH_PATHS = ("/health", "/v1/agl/health")
"""Open even when a bearer key is set, so probes and load balancers need no secret."""


async def health(request: Request) -> Any:
    return {"status": "ok"}


async def statistics(request: Request) -> Any:
    return await store_of(request).statistics()


async def prometheus(request: Request) -> Any:
    stats = await store_of(request).statistics()
    return Response(metrics_of(request).render(stats), media_type=PROMETHEUS_MEDIA_TYPE)


def routes(prefix: str) -> list[Route]:
    return [
        endpoint("/health", health, methods=["GET"]),
        endpoint(prefix + "/health", health, methods=["GET"]),
        endpoint(prefix + "/statistics", statistics, methods=["GET"]),
        endpoint("/metrics", prometheus, methods=["GET"]),
    ]
