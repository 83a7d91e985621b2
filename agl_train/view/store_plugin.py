"""The view as a plug-in of the store server: the `agl.store_pages` entry point
(`agl_store.server.StorePagesFactory`).

`agl store serve` (and the store embedded in `agl proxy serve`) look up this entry-point
group, so agl_store serves the view at `/` without importing agl_train by name. The store
server calls `store_pages(settings)` with the `--page-setting view.KEY=VALUE` options of its
command line (`create_app(..., page_settings={"view": {...}})` in Python):

- `tokenizer`: a local tokenizer (model) directory; unset uses the published model's tokenizer
  when it is readable here, else shows raw token ids;
- `level`: `trajectory` (default) or `transition`;
- `max_prompt_length`, `max_response_length`: the aggregator's limits (default 2048 / 8192).
"""

from __future__ import annotations

from collections.abc import Mapping

from agl_store.server import StorePages, StorePagesFactory

from ..core.aggregate import AGGREGATORS, LEVEL_TRAJECTORY, Limits
from .routes import OPEN_PATHS, ViewRoutes, ViewSettings
from .token_view import DEFAULT_LIMITS, TokenViewOptions

SETTINGS = ("tokenizer", "level", "max_prompt_length", "max_response_length")


def view_settings(settings: Mapping[str, str]) -> ViewSettings:
    """`ViewSettings` from the plug-in's settings (see the module docstring); ValueError names a bad one."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown view setting(s) {unknown}; the view takes {list(SETTINGS)}")
    level = settings.get("level") or LEVEL_TRAJECTORY
    if level not in AGGREGATORS:
        raise ValueError(f"view.level {level!r}: expected one of {sorted(AGGREGATORS)}")
    limits = Limits(
        _length(settings, "max_prompt_length", DEFAULT_LIMITS.max_prompt_length),
        _length(settings, "max_response_length", DEFAULT_LIMITS.max_response_length),
    )
    options = TokenViewOptions(level=level, limits=limits)
    return ViewSettings(tokenizer=settings.get("tokenizer") or None, options=options)


def _length(settings: Mapping[str, str], name: str, default: int) -> int:
    text = settings.get(name)
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"view.{name} {text!r}: expected a whole number of tokens") from None


def store_pages(settings: Mapping[str, str]) -> StorePages:
    """The `agl.store_pages` entry point: the view's routes for the store server."""
    return StorePages(routes=ViewRoutes(view_settings(settings)).routes(), open_paths=OPEN_PATHS)


_IMPLEMENTS: StorePagesFactory = store_pages  # mypy checks the entry point against the store's spec
