"""The proxy's ASGI app: OpenAI routes, per-rollout routes, admin routes, metrics.

`create_app(gateway, key=..., store_app=...)` builds it from explicit parts. With
`store_app` (the store's REST app, when the proxy runs an embedded store) the store's
routes are served on the same port, so one URL is the whole gateway.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, AsyncIterator, Dict, List, Optional

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

from .auth import OPEN_PATHS, BearerKeyMiddleware
from .calls import LLMCallEndpoint, json_object
from .errors import BadRequestError, ProxyError
from .gateway import Gateway

ROLLOUT_PREFIX = "/rollout/{rollout_id}/attempt/{attempt_id}"


class JSONBytesResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


async def _error_response(request: Request, error: Exception) -> Response:
    """What the admin routes answer when they raise a ProxyError."""
    assert isinstance(error, ProxyError)
    return Response(error.body(), status_code=error.status_code, media_type="application/json", headers=error.headers)


async def _json_body(request: Request) -> Dict[str, Any]:
    """The admin request's JSON object; an empty body is an empty object."""
    raw = await request.body()
    return json_object(raw) if raw else {}


def _admin_routes(gateway: Gateway) -> List[BaseRoute]:
    async def health(request: Request) -> Response:
        return JSONBytesResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        created = int(time.time())
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "agl"}
            for name in gateway.registry.model_names
        ]
        return JSONBytesResponse({"object": "list", "data": data})

    async def state(request: Request) -> Response:
        return JSONBytesResponse(
            {
                **gateway.gate.state(),
                "models": gateway.registry.model_names,
                "spans_buffered": gateway.exporter.buffered,
            }
        )

    async def pause(request: Request) -> Response:
        """Body (optional): `reason`; `drain: true` waits (up to `timeout` s) until no call is in flight."""
        body = await _json_body(request)
        gateway.gate.pause(body.get("reason"))
        drained = None
        if body.get("drain"):
            drained = await gateway.gate.wait_drained(body.get("timeout"))
        return JSONBytesResponse({**gateway.gate.state(), "drained": drained})

    async def resume(request: Request) -> Response:
        gateway.gate.resume()
        return JSONBytesResponse(gateway.gate.state())

    async def model_list(request: Request) -> Response:
        if request.method == "POST":
            entries = (await _json_body(request)).get("model_list")
            if not isinstance(entries, list):
                raise BadRequestError('the body must be {"model_list": [...]} in LiteLLM\'s format')
            try:
                gateway.update_model_list(entries)
            except ValueError as exc:
                raise BadRequestError(str(exc)) from exc
        return JSONBytesResponse({"model_list": gateway.registry.redacted()})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(gateway.metrics.render(gateway.gauges()), media_type="text/plain; version=0.0.4")

    return [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/proxy/state", state, methods=["GET"]),
        Route("/proxy/pause", pause, methods=["POST"]),
        Route("/proxy/resume", resume, methods=["POST"]),
        Route("/proxy/model_list", model_list, methods=["GET", "POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route(ROLLOUT_PREFIX + "/v1/models", models, methods=["GET"]),
    ]


def _call_routes(gateway: Gateway) -> List[BaseRoute]:
    chat = LLMCallEndpoint(gateway, "chat")
    completions = LLMCallEndpoint(gateway, "text_completion")
    routes: List[BaseRoute] = []
    # Base URLs with and without /v1 both occur in agent code; serve both.
    for prefix in ("", ROLLOUT_PREFIX):
        for version in ("/v1", ""):
            routes.append(Route(prefix + version + "/chat/completions", chat, methods=["POST"]))
            routes.append(Route(prefix + version + "/completions", completions, methods=["POST"]))
    return routes


def create_app(gateway: Gateway, *, key: Optional[str] = None, store_app: Optional[ASGIApp] = None) -> ASGIApp:
    """The proxy's ASGI app over `gateway`; `key` turns on bearer auth (all routes but /health)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[Dict[str, Any]]:
        async with contextlib.AsyncExitStack() as stack:
            state: Dict[str, Any] = {}
            # A mounted app's lifespan does not run by itself; its routes need its state.
            inner = getattr(getattr(store_app, "router", None), "lifespan_context", None)
            if inner is not None:
                state.update(await stack.enter_async_context(inner(store_app)) or {})
            await gateway.open()
            stack.push_async_callback(gateway.close)
            yield state

    routes = _call_routes(gateway) + _admin_routes(gateway)
    if store_app is not None:
        routes.append(Mount("/", app=store_app))
    app: ASGIApp = Starlette(routes=routes, lifespan=lifespan, exception_handlers={ProxyError: _error_response})
    if key:
        # The embedded store's open paths (its health check, the view's page shell) stay open here too.
        store_open_paths = getattr(getattr(store_app, "state", None), "open_paths", frozenset())
        app = BearerKeyMiddleware(app, key, open_paths=OPEN_PATHS | store_open_paths)
    return app
