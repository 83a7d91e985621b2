"""The plug-in contract of store pages: what an `agl.store_pages` entry point is and returns.

The store server serves pages it does not know by name (agl_train's web view): each entry
point of the group names a `StorePagesFactory`, which the server calls with its settings and
which returns `StorePages`. The plug-in implements these types; it does not define them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Protocol

from starlette.routing import BaseRoute

logger = logging.getLogger("agl_store.server")

PAGES_ENTRY_POINT_GROUP = "agl.store_pages"


@dataclass(frozen=True)
class StorePages:
    """What a store-pages plug-in adds to the server."""

    routes: Sequence[BaseRoute]
    open_paths: frozenset[str]
    """Paths served without the bearer key: page shells, never data."""


class StorePagesFactory(Protocol):
    """The callable an `agl.store_pages` entry point names.

    `settings` are the `--page-setting NAME.KEY=VALUE` options addressed to the entry point's
    NAME, without the prefix (empty when none). Raises ValueError for a setting it does not
    know or cannot use.
    """

    def __call__(self, settings: Mapping[str, str]) -> StorePages: ...


PageSettings = Mapping[str, Mapping[str, str]]
"""Settings of the pages plug-ins: entry-point name -> {setting: value}."""

PAGE_SETTING_HELP = (
    "a setting of a store-pages plug-in, repeatable; the web view takes view.tokenizer=DIR, view.level, "
    "view.max_prompt_length, view.max_response_length"
)
"""The help of the `--page-setting NAME.KEY=VALUE` option of the commands that serve a store."""


def parse_page_settings(options: Sequence[str]) -> dict[str, dict[str, str]]:
    """`--page-setting NAME.KEY=VALUE` options as PageSettings; ValueError names a malformed one."""
    settings: dict[str, dict[str, str]] = {}
    for option in options:
        target, equals, value = option.partition("=")
        name, dot, key = target.partition(".")
        if not (equals and dot and name and key):
            raise ValueError(f"--page-setting {option!r}: expected NAME.KEY=VALUE, e.g. view.tokenizer=/models/qwen")
        settings.setdefault(name, {})[key] = value
    return settings


def discover_pages(settings: PageSettings | None = None) -> tuple[list[BaseRoute], frozenset[str]]:
    """The routes and keyless paths of every installed `agl.store_pages` entry point.

    A plug-in that fails to import is logged and skipped (the store serves without it); settings
    addressed to a plug-in that is not installed, or refused by it, raise ValueError; a plug-in
    that returns anything but `StorePages` raises TypeError.
    """
    settings = settings or {}
    routes: list[BaseRoute] = []
    open_paths: set[str] = set()
    found: set[str] = set()
    for entry in entry_points(group=PAGES_ENTRY_POINT_GROUP):
        found.add(entry.name)
        try:
            make_pages: StorePagesFactory = entry.load()
        except Exception as exc:
            logger.warning("store pages %r skipped: %s", entry.name, exc)
            continue
        pages = make_pages(dict(settings.get(entry.name, {})))
        if not isinstance(pages, StorePages):
            raise TypeError(f"store pages {entry.name!r} returned {type(pages).__name__}, not StorePages")
        routes += pages.routes
        open_paths |= pages.open_paths
    unknown = sorted(set(settings) - found)
    if unknown:
        raise ValueError(f"page settings for {unknown}, but the installed store pages are {sorted(found)}")
    return routes, frozenset(open_paths)
