"""The LightningStore served over HTTP: `create_app(store)` builds the Starlette app; `pages`
declares the plug-in contract of the pages it serves beside the store's routes."""

from .app import DEFAULT_MAX_BODY_BYTES, create_app
from .pages import PAGE_SETTING_HELP, PageSettings, StorePages, StorePagesFactory, parse_page_settings

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "PAGE_SETTING_HELP",
    "PageSettings",
    "StorePages",
    "StorePagesFactory",
    "create_app",
    "parse_page_settings",
]
