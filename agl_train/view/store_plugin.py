"""The view as a plug-in of the store server: the `agl.store_pages` entry point.

`agl store serve` (and the store embedded in `agl proxy serve`) look up this entry-point
group, so agl_store serves the view at `/` without importing agl_train by name. The
embedded view takes its settings from the environment, since the store's command line
knows nothing of tokenizers:

- `AGL_VIEW_TOKENIZER`: a local tokenizer (model) directory; unset shows raw token ids;
- `AGL_VIEW_LEVEL`: `trajectory` (default) or `transition`;
- `AGL_VIEW_MAX_PROMPT_LENGTH`, `AGL_VIEW_MAX_RESPONSE_LENGTH`: the limits (default 2048 / 8192).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import FrozenSet, List, Mapping, Optional

from starlette.routing import BaseRoute

from ..aggregate import LEVEL_TRAJECTORY, Limits
from .routes import OPEN_PATHS, ViewRoutes, ViewSettings
from .token_view import DEFAULT_LIMITS, TokenViewOptions


@dataclass(frozen=True)
class StorePages:
    """What a store-pages entry point hands the store server: routes, and the paths served without a key."""

    routes: List[BaseRoute]
    open_paths: FrozenSet[str]


def settings_from_env(env: Optional[Mapping[str, str]] = None) -> ViewSettings:
    """`ViewSettings` from the `AGL_VIEW_*` variables (see the module docstring)."""
    env = os.environ if env is None else env
    limits = Limits(
        int(env.get("AGL_VIEW_MAX_PROMPT_LENGTH") or DEFAULT_LIMITS.max_prompt_length),
        int(env.get("AGL_VIEW_MAX_RESPONSE_LENGTH") or DEFAULT_LIMITS.max_response_length),
    )
    options = TokenViewOptions(level=env.get("AGL_VIEW_LEVEL") or LEVEL_TRAJECTORY, limits=limits)
    return ViewSettings(tokenizer=env.get("AGL_VIEW_TOKENIZER") or None, options=options)


def store_pages() -> StorePages:
    """The `agl.store_pages` entry point: the view's routes for the store server."""
    return StorePages(routes=ViewRoutes(settings_from_env()).routes(), open_paths=OPEN_PATHS)
