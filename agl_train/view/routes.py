"""The view's HTTP routes: the page shell (served without a key) and its JSON API (behind it).

    routes = ViewRoutes(ViewSettings(tokenizer="/models/qwen")).routes()

The page shell (`/`, `/view/app.js`, `/view/app.css`) holds no data, so it is served
without the bearer key; the page then asks for the key once and sends it on every API call.
The API lives under `/view/api/` and reads the store from the app's lifespan state
(`request.scope["state"]["store"]`), the way every store route does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from agl_store import call_span
from agl_store.errors import InvalidInputError
from agl_store.models import ROLLOUT_MODES, ROLLOUT_STATUSES
from agl_store.transitions import check_rollout_mode, check_rollout_status
from agl_store.web.wire import endpoint, store_of

from ..core.aggregate import AGGREGATORS, Limits
from .steps import StepSummaries
from .summaries import MAX_PAGE_SIZE, RolloutFilter, SummaryCache, list_rollouts, rollout_detail, span_detail
from .token_view import TokenViewOptions, token_view
from .tokenizers import Tokenizers

API_PREFIX = "/view/api"
STATIC_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/view/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/view/app.css": ("app.css", "text/css; charset=utf-8"),
}
OPEN_PATHS: frozenset[str] = frozenset(STATIC_FILES)
"""Paths served without the bearer key: the page shell only, never data."""

# Agent output is untrusted: even if something slipped past textContent, no inline script,
# inline handler or foreign resource would run.
_SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
}
N = TypeVar("N", int, float)


@dataclass(frozen=True)
class ViewSettings:
    """How the view builds token rows: the tokenizer that decodes them and the trainer's aggregator settings."""

    tokenizer: str | None = None
    """A local tokenizer directory (a model directory); None decodes with the published model's
    tokenizer when it is readable here (`tokenizers.py`), else shows raw token ids."""
    options: TokenViewOptions = field(default_factory=TokenViewOptions)


def _number(request: Request, name: str, kind: Callable[[str], N], default: N | None = None) -> N | None:
    """Query parameter `name` as `kind` (int or float); absent or empty gives `default`."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise InvalidInputError(
            f"{name}: expected {'an integer' if kind is int else 'a number'}, got {raw!r}"
        ) from None


def _int(request: Request, name: str, default: int) -> int:
    value = _number(request, name, int, default)
    assert value is not None
    return value


def rollout_filter(request: Request) -> RolloutFilter:
    """The list filters from the query: `status` (repeated or comma-separated), `mode`,
    `after` / `before` (epoch seconds), `q` (part of the rollout id), `limit`, `offset`."""
    statuses = [
        check_rollout_status(s) for value in request.query_params.getlist("status") for s in value.split(",") if s
    ]
    return RolloutFilter(
        status_in=statuses or None,
        mode=check_rollout_mode(request.query_params.get("mode") or None),
        start_time_after=_number(request, "after", float),
        start_time_before=_number(request, "before", float),
        rollout_id_contains=request.query_params.get("q") or None,
        limit=_int(request, "limit", 50),
        offset=_int(request, "offset", 0),
    )


class ViewRoutes:
    """The view's routes over one `ViewSettings`; a tokenizer is loaded once, on first use."""

    def __init__(self, settings: ViewSettings) -> None:
        self.settings = settings
        self.tokenizers = Tokenizers(settings.tokenizer)
        self._summaries = SummaryCache()
        self._steps = StepSummaries(settings.options)

    def routes(self) -> list[BaseRoute]:
        """The page shell and the API routes, to add to a Starlette app that has a store in its state."""
        static: list[BaseRoute] = [
            Route(path, _static_page(name, media)) for path, (name, media) in STATIC_FILES.items()
        ]
        return static + [
            endpoint(f"{API_PREFIX}/config", self.config, methods=["GET"]),
            endpoint(f"{API_PREFIX}/rollouts", self.rollouts, methods=["GET"]),
            endpoint(f"{API_PREFIX}/steps", self.steps, methods=["GET"]),
            endpoint(f"{API_PREFIX}/rollouts/{{rollout_id}}", self.rollout, methods=["GET"]),
            endpoint(f"{API_PREFIX}/rollouts/{{rollout_id}}/tokens", self.tokens, methods=["GET"]),
            endpoint(f"{API_PREFIX}/rollouts/{{rollout_id}}/spans/{{span_id}}", self.span, methods=["GET"]),
        ]

    async def config(self, request: Request) -> dict[str, Any]:
        options = self.settings.options
        return {
            "tokenizer": self.settings.tokenizer is not None,
            "level": options.level,
            "levels": sorted(AGGREGATORS),
            "limits": {
                "max_prompt_length": options.limits.max_prompt_length,
                "max_response_length": options.limits.max_response_length,
            },
            "statuses": list(ROLLOUT_STATUSES),
            "modes": list(ROLLOUT_MODES),
            "max_page_size": MAX_PAGE_SIZE,
            # The span detail shows these attributes of an LLM-call span on their own.
            "call_span": {"request": call_span.REQUEST, "response": call_span.RESPONSE, "error": call_span.ERROR},
        }

    async def steps(self, request: Request) -> dict[str, Any]:
        return await self._steps.steps(store_of(request), _int(request, "limit", 20), _int(request, "offset", 0))

    async def rollouts(self, request: Request) -> dict[str, Any]:
        return await list_rollouts(store_of(request), rollout_filter(request), self._summaries)

    async def rollout(self, request: Request) -> dict[str, Any]:
        return await rollout_detail(store_of(request), request.path_params["rollout_id"])

    async def span(self, request: Request) -> dict[str, Any]:
        return await span_detail(store_of(request), request.path_params["rollout_id"], request.path_params["span_id"])

    async def tokens(self, request: Request) -> dict[str, Any]:
        options = self._options(request)
        tokenizer, path = await self.tokenizers.get(store_of(request))
        view = await token_view(store_of(request), request.path_params["rollout_id"], options, tokenizer)
        return {**view, "tokenizer": path}

    def _options(self, request: Request) -> TokenViewOptions:
        # The page may try other levels and limits than the configured ones, to see what they would train.
        base = self.settings.options
        level = request.query_params.get("level") or base.level
        if level not in AGGREGATORS:
            raise InvalidInputError(
                f"level: unknown trace_aggregator level {level!r}; expected one of {sorted(AGGREGATORS)}"
            )
        try:
            limits = Limits(
                _int(request, "max_prompt_length", base.limits.max_prompt_length),
                _int(request, "max_response_length", base.limits.max_response_length),
            )
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        return TokenViewOptions(level=level, limits=limits, reward_fillna_value=base.reward_fillna_value)


def _static_page(name: str, media_type: str) -> Any:
    # Read once when the routes are built: a few kilobytes, and no file I/O on the event loop per request.
    body = files(__package__).joinpath("static", name).read_bytes()

    async def serve(request: Request) -> Response:
        return Response(body, media_type=media_type, headers=_SECURITY_HEADERS)

    serve.__name__ = f"static_{name.replace('.', '_')}"
    return serve
