"""The HTTP client the proxy forwards with: httpx's API over aiohttp's C-parsed connections.

The transport is the store client's (`agl_store.web.http_transport`), in streaming mode so
that completions reach the agent as the backend produces them.
"""

from __future__ import annotations

import httpx

from agl_store.web.http_transport import AiohttpTransport


def make_transport() -> AiohttpTransport:
    """The proxy's upstream connections: no pool limit (the proxy must not queue calls that the
    backend could serve), streamed bodies."""
    return AiohttpTransport(max_connections=0, stream=True)


def make_client(transport: AiohttpTransport) -> httpx.AsyncClient:
    """The proxy's upstream client on `transport`, without a client-side timeout (calls set their own).
    The token chain's engine requests go through `engine_http.EngineHttp` instead."""
    return httpx.AsyncClient(transport=transport, timeout=None)
