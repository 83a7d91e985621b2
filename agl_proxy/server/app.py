"""The proxy's ASGI app: OpenAI routes, per-rollout routes, admin routes, metrics.

`create_app(proxy_state, key=..., admin_key=..., store_app=...)` builds it from explicit parts.
With `store_app` (the store's REST app, when the proxy runs an embedded store) the store's
routes are served on the same port, so one URL is the whole proxy_state.

Two groups of routes, two keys: the LLM routes (what agents call) take `key` or the admin
key; the admin routes (`/proxy/*`, `/metrics`) and the store's take only `admin_key`, so an
agent holding its key cannot repoint, pause or read the proxy, nor touch the store.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

from agl_store.web import auth as store_auth
from agl_store.web.cross_site import CrossSiteGuard, is_loopback

from ..common.errors import BadRequestError, ModelNotFoundError, ProxyError, render_error
from ..translate.messages import MESSAGES
from ..translate.responses import RESPONSES
from .auth import BearerKeyMiddleware
from .calls import LLMCallEndpoint, json_object
from .state import ProxyState
from .token_count import CountTokensEndpoint

ROLLOUT_PREFIX = "/rollout/{rollout_id}/attempt/{attempt_id}"
CANCEL_GRACE_S = 10.0
"""How long `/proxy/pause` waits for the calls it cancelled to answer their clients."""


ADMIN_KEY = "the proxy's admin key (the LLM routes' key is not enough here)"


class JSONBytesResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


async def _error_response(request: Request, error: Exception) -> Response:
    """What the admin routes answer when they raise a ProxyError."""
    assert isinstance(error, ProxyError)
    return Response(error.body(), status_code=error.status_code, media_type="application/json", headers=error.headers)


async def _json_body(request: Request) -> dict[str, Any]:
    """The admin request's JSON object; an empty body is an empty object."""
    raw = await request.body()
    return json_object(raw) if raw else {}


@dataclass(frozen=True)
class PauseRequest:
    """A `/proxy/pause` body."""

    reason: str | None = None
    drain: bool = False
    """Answer once no call is in flight (or `timeout` passed)."""
    timeout: float | None = None
    cancel_after_drain_timeout: bool = False
    """When the drain times out, cancel the calls still in flight (each answered 503)."""
    cancel_grace: float = CANCEL_GRACE_S
    """How long to wait for the cancelled calls to answer their clients."""
    hold: float | None = None
    """How long calls held by this pause wait for the resume (default: the proxy's `--hold`)."""
    stop_generations: bool = False
    """The token chain's calls in flight stop generating, keep what they sampled and continue on
    the resume (on the weights served then); the drain then waits only for the other calls."""


PAUSE_FIELDS = ("reason", "drain", "timeout", "cancel_after_drain_timeout", "cancel_grace", "hold", "stop_generations")


def _seconds(body: dict[str, Any], field: str) -> float | None:
    value = body.get(field)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
    ):
        raise BadRequestError(f"{field} must be a finite number of seconds >= 0, got {value!r:.50}")
    return None if value is None else float(value)


def pause_request(body: dict[str, Any]) -> PauseRequest:
    """The `/proxy/pause` body checked; BadRequestError names a bad field."""
    unknown = sorted(set(body) - set(PAUSE_FIELDS))
    if unknown:
        raise BadRequestError(f"unknown field {unknown[0]!r:.50}; a pause takes {', '.join(PAUSE_FIELDS)}")
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise BadRequestError(f"reason must be a string, got {type(reason).__name__}")
    for flag in ("drain", "cancel_after_drain_timeout", "stop_generations"):
        value = body.get(flag)
        if value is not None and not isinstance(value, bool):
            raise BadRequestError(f"{flag} must be true or false, got {value!r:.50}")
    timeout, grace, hold = (_seconds(body, field) for field in ("timeout", "cancel_grace", "hold"))
    cancel = bool(body.get("cancel_after_drain_timeout"))
    if cancel and not body.get("drain"):
        raise BadRequestError("cancel_after_drain_timeout needs drain: true (and a timeout)")
    drain = bool(body.get("drain"))
    grace = CANCEL_GRACE_S if grace is None else grace
    return PauseRequest(reason, drain, timeout, cancel, grace, hold, bool(body.get("stop_generations")))


def _model_entry(name: str, created: int) -> dict[str, Any]:
    """A model as OpenAI's and Anthropic's SDKs both read it (each ignores the other's fields)."""
    created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "agl",
        "type": "model",
        "display_name": name,
        "created_at": created_at,
    }


def _model_routes(proxy_state: ProxyState, middleware: list[Middleware]) -> list[BaseRoute]:
    async def models(request: Request) -> Response:
        created = int(time.time())
        data = [_model_entry(name, created) for name in proxy_state.registry.model_names]
        ids = [entry["id"] for entry in data] or [None]
        # Anthropic's SDK pages through models; agl's fit in one page.
        page = {"has_more": False, "first_id": ids[0], "last_id": ids[-1]}
        return JSONBytesResponse({"object": "list", "data": data, **page})

    async def model(request: Request) -> Response:
        name = request.path_params["model"]
        if name not in proxy_state.registry.model_names:
            raise ModelNotFoundError(f"model: no model named {name!r:.100}; GET /v1/models lists them")
        return JSONBytesResponse(_model_entry(name, int(time.time())))

    routes: list[BaseRoute] = []
    for prefix in ("", ROLLOUT_PREFIX):
        for version in ("/v1", ""):
            for path, endpoint in (("/models", models), ("/models/{model:path}", model)):
                routes.append(Route(prefix + version + path, endpoint, methods=["GET"], middleware=middleware))
    return routes


def _admin_routes(proxy_state: ProxyState, middleware: list[Middleware]) -> list[BaseRoute]:
    async def state(request: Request) -> Response:
        return JSONBytesResponse(
            {
                **proxy_state.gate.state(),
                "models": proxy_state.registry.model_names,
                "spans_buffered": proxy_state.exporter.buffered,
            }
        )

    async def pause(request: Request) -> Response:
        """Body (optional): `reason`; `stop_generations: true` has the token chain's calls in flight
        stop generating and park until the resume, where they continue; `drain: true` waits (up to
        `timeout` s) until no call is in flight but parked ones; `cancel_after_drain_timeout: true`
        then cancels the calls still running and waits up to `cancel_grace` s for them to answer;
        `hold` bounds how long new and parked calls wait for the resume."""
        ask = pause_request(await _json_body(request))  # checked before anything changes
        gate = proxy_state.gate
        gate.pause(ask.reason, hold_s=ask.hold, stop_generations=ask.stop_generations)
        drained = None
        cancelled = 0
        if ask.drain:
            drained = await gate.wait_drained(ask.timeout)
            if not drained and ask.cancel_after_drain_timeout:
                cancelled = gate.cancel_in_flight()
                # Each cancelled call answers its client and queues its span, which takes moments.
                drained = await gate.wait_drained(ask.cancel_grace)
        return JSONBytesResponse({**gate.state(), "drained": drained, "cancelled": cancelled})

    async def resume(request: Request) -> Response:
        proxy_state.gate.resume()
        return JSONBytesResponse(proxy_state.gate.state())

    async def model_list(request: Request) -> Response:
        if request.method == "POST":
            entries = (await _json_body(request)).get("model_list")
            if not isinstance(entries, list):
                raise BadRequestError('the body must be {"model_list": [...]} in LiteLLM\'s format')
            try:
                proxy_state.update_model_list(entries)
            except ValueError as exc:
                raise BadRequestError(str(exc)) from exc
        return JSONBytesResponse({"model_list": proxy_state.registry.redacted()})

    async def sampling(request: Request) -> Response:
        if request.method == "POST":
            try:
                proxy_state.sampling.update(await _json_body(request))
            except ValueError as exc:
                raise BadRequestError(str(exc)) from exc
        return JSONBytesResponse(proxy_state.sampling.state())

    async def metrics(request: Request) -> Response:
        text = proxy_state.metrics.render(proxy_state.gauges())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    return [
        Route("/metrics", metrics, methods=["GET"], middleware=middleware),
        Route("/proxy/state", state, methods=["GET"], middleware=middleware),
        Route("/proxy/pause", pause, methods=["POST"], middleware=middleware),
        Route("/proxy/resume", resume, methods=["POST"], middleware=middleware),
        Route("/proxy/model_list", model_list, methods=["GET", "POST"], middleware=middleware),
        Route("/proxy/sampling", sampling, methods=["GET", "POST"], middleware=middleware),
    ]


async def _health(request: Request) -> Response:
    return JSONBytesResponse({"status": "ok"})


def _call_routes(proxy_state: ProxyState, middleware: list[Middleware]) -> list[BaseRoute]:
    endpoints: dict[str, ASGIApp] = {
        "/chat/completions": LLMCallEndpoint(proxy_state, "chat"),
        "/completions": LLMCallEndpoint(proxy_state, "text_completion"),
        "/responses": LLMCallEndpoint(proxy_state, "chat", RESPONSES),
        "/messages": LLMCallEndpoint(proxy_state, "chat", MESSAGES),
        "/messages/count_tokens": CountTokensEndpoint(proxy_state),
    }
    routes: list[BaseRoute] = []
    # Base URLs with and without /v1 both occur in agent code; serve both.
    for prefix in ("", ROLLOUT_PREFIX):
        for version in ("/v1", ""):
            for path, endpoint in endpoints.items():
                routes.append(Route(prefix + version + path, endpoint, methods=["POST"], middleware=middleware))
    return routes


def create_app(
    proxy_state: ProxyState,
    *,
    key: str | None = None,
    admin_key: str | None = None,
    store_app: ASGIApp | None = None,
    host: str = "127.0.0.1",
) -> ASGIApp:
    """The proxy's ASGI app over `proxy_state`.

    `key` is required on the LLM routes (the admin key works there too), `admin_key` on the
    admin routes and the store's; a group without its key is open. `/health` is always open.
    `host` is the address served on: routes without a key on a loopback address answer only
    loopback `Host` names (`agl_store.web.cross_site` has every check against web pages).
    """
    loopback = is_loopback(host)

    def protected(group_key: str | None, other_keys: tuple[str, ...], what: str) -> list[Middleware]:
        middleware = [Middleware(CrossSiteGuard, keyless=not group_key, loopback=loopback, render=render_error)]
        if group_key:
            middleware.append(Middleware(BearerKeyMiddleware, key=group_key, other_keys=other_keys, what=what))
        return middleware

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        async with contextlib.AsyncExitStack() as stack:
            state: dict[str, Any] = {}
            # A mounted app's lifespan does not run by itself; its routes need its state.
            inner = getattr(getattr(store_app, "router", None), "lifespan_context", None)
            if inner is not None:
                state.update(await stack.enter_async_context(inner(store_app)) or {})
            await proxy_state.open()
            stack.push_async_callback(proxy_state.close)
            yield state

    client = protected(key, (admin_key,) if admin_key else (), "the proxy's key")
    admin = protected(admin_key, (), ADMIN_KEY)
    health = [Middleware(CrossSiteGuard, keyless=not (key or admin_key), loopback=loopback, render=render_error)]
    routes = [
        Route("/health", _health, methods=["GET"], middleware=health),
        *_call_routes(proxy_state, client),
        *_model_routes(proxy_state, client),
        *_admin_routes(proxy_state, admin),
    ]
    if store_app is not None:
        # The store app guards itself against web pages; here it gets the admin key on top,
        # its open paths (its health check, the view's page shell) staying open. Its refusals
        # are in the store's error shape, as `agl store serve` answers them: store clients read that.
        store_open_paths: Collection[str] = getattr(getattr(store_app, "state", None), "open_paths", frozenset())
        mount = (
            [Middleware(store_auth.BearerKeyMiddleware, key=admin_key, open_paths=store_open_paths, what=ADMIN_KEY)]
            if admin_key
            else []
        )
        routes.append(Mount("/", app=store_app, middleware=mount))
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={ProxyError: _error_response})
