"""A real headless browser for the view's tests: Debian's chromium driven by playwright.

Never `playwright install` (it downloads a browser): the tests use /usr/bin/chromium, which
`scripts/test.sh` installs with apt-get, and skip with the reason when it is missing.
"""

from __future__ import annotations

import os

CHROMIUM = os.environ.get("AGL_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS: list[str] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -r requirements/test.txt)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no chromium at {CHROMIUM} (apt-get install chromium; scripts/test.sh does it as root)"
    return None
