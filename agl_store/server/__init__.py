"""The LightningStore served over HTTP: `create_app(store)` builds the Starlette app."""

from .app import DEFAULT_MAX_BODY_BYTES, create_app

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_app"]
