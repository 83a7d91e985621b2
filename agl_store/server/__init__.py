"""The LightningStore served over HTTP: `create_app(store)` builds the Starlette app."""

from .app import DEFAULT_MAX_BODY_BYTES, PAGE_SETTING_HELP, PageSettings, create_app, parse_page_settings

__all__ = ["DEFAULT_MAX_BODY_BYTES", "PAGE_SETTING_HELP", "PageSettings", "create_app", "parse_page_settings"]
