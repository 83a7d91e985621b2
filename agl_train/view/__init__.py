"""A web view of training steps, rollouts, spans and token masks.

Served by the store server at `/` (through the `agl.store_pages` entry point, see
`store_plugin.py`) and by `agl view --store URL` on its own (`app.py`, `cli.py`). The token view
builds rows with the training core's own functions (`token_view.py`), so it shows what the
trainer trains; the training page sums a step's rollouts the same way (`steps.py`).
"""

from .app import create_view_app
from .routes import OPEN_PATHS, ViewRoutes, ViewSettings
from .store_plugin import store_pages, view_settings
from .token_view import TokenViewOptions, token_view, token_view_of_trace

__all__ = [
    "OPEN_PATHS",
    "TokenViewOptions",
    "ViewRoutes",
    "ViewSettings",
    "create_view_app",
    "store_pages",
    "token_view",
    "token_view_of_trace",
    "view_settings",
]
