"""One module per resource; `all_routes()` lists them in matching order."""

from __future__ import annotations

from starlette.routing import BaseRoute

from ...http_paths import AGL_PREFIX
from . import attempts, queues, resources, rollouts, spans, system, workers


def all_routes() -> list[BaseRoute]:
    """Every store route. Fixed paths (`/search`, `/latest`) precede `{id}` paths."""
    return [
        *system.routes(AGL_PREFIX),
        *queues.routes(AGL_PREFIX),
        *attempts.routes(AGL_PREFIX),
        *rollouts.routes(AGL_PREFIX),
        *spans.routes(AGL_PREFIX),
        *resources.routes(AGL_PREFIX),
        *workers.routes(AGL_PREFIX),
    ]
