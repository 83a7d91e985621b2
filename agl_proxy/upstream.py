"""The HTTP client the proxy forwards with: httpx's API over aiohttp's C-parsed connections.

The transport is the store client's (`agl_store.web.http_transport`), in streaming mode so
that completions reach the agent as the backend produces them.
"""

from __future__ import annotations

import httpx

from agl_store.web.http_transport import AiohttpTransport


def make_client() -> httpx.AsyncClient:
    """The proxy's upstream client: no pool limit (the proxy must not queue calls that the
    backend could serve), streamed bodies, no client-side timeout (calls set their own)."""
    return httpx.AsyncClient(transport=AiohttpTransport(max_connections=0, stream=True), timeout=None)
