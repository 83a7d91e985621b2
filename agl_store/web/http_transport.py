"""An httpx transport on aiohttp: httpx's API with aiohttp's C-parsed connections.

httpx's default transport parses HTTP in pure Python (h11 over anyio). On the store
client's many small JSON calls that cost about 0.7 ms of client CPU per call, three times
what aiohttp's parser costs; on the proxy's forwarding path it was about 80 % of the
proxy's CPU per call. Callers keep httpx's API (one `AsyncClient`, its timeouts and error
classes, injected transports in tests) and aiohttp's errors become httpx's here.

Both the store client (whole bodies) and the proxy (streamed bodies) use this one class.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import httpx

UVICORN_KEEPALIVE_S = 5.0
"""uvicorn's default keep-alive (so vLLM's and the store server's)."""

_SKIPPED_AUTO_HEADERS = ("User-Agent", "Accept-Encoding", "Accept")  # httpx sends its own


def translate_error(exc: BaseException, request: httpx.Request, connecting: bool) -> httpx.TransportError:
    """aiohttp's error as the httpx error callers handle (`connecting`: before any answer)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(exc), request=request)
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        kind = httpx.ConnectTimeout if connecting else httpx.ReadTimeout
        return kind(f"timed out: {exc!r}", request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        # The proxy resends once on this: the server closed a kept-alive connection.
        return httpx.RemoteProtocolError(str(exc) or "server disconnected", request=request)
    return httpx.ReadError(str(exc) or type(exc).__name__, request=request)


class _StreamedBody(httpx.AsyncByteStream):
    """A response body handed on chunk by chunk as aiohttp receives it."""

    def __init__(self, answer: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._answer = answer
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._answer.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise translate_error(exc, self._request, connecting=False) from exc

    async def aclose(self) -> None:
        self._answer.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Sends httpx requests over one aiohttp session, created on first use in its loop.

    Args:
        max_connections: the pool's size; 0 is unbounded (the proxy must not queue calls
            that its backend could serve).
        keepalive_s: how long an idle connection is kept. Below the server's own keep-alive
            the client drops a connection before the server does instead of racing it.
        stream: hand response bodies on as they arrive (the proxy's streamed completions);
            otherwise a body is read whole before the response is returned, which costs
            less per call for small JSON answers.
    """

    def __init__(
        self, *, max_connections: int = 100, keepalive_s: float = UVICORN_KEEPALIVE_S - 1.0, stream: bool = False
    ) -> None:
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self._stream = stream
        self._session: aiohttp.ClientSession | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=self._keepalive_s),
                auto_decompress=False,  # httpx decodes Content-Encoding from the raw stream
                skip_auto_headers=_SKIPPED_AUTO_HEADERS,
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        limits = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=limits.get("connect"), sock_read=limits.get("read"))
        connecting = True
        try:
            answer = await self._session_now().request(
                request.method,
                str(request.url),
                data=request.content or None,
                headers=request.headers.multi_items(),
                timeout=timeout,
                allow_redirects=False,
            )
            if self._stream:
                stream: httpx.AsyncByteStream = _StreamedBody(answer, request)
            else:
                connecting = False
                async with answer:
                    stream = httpx.ByteStream(await answer.read())
        except (TimeoutError, aiohttp.ClientError) as exc:
            connecting = connecting and isinstance(exc, (aiohttp.ClientConnectorError, asyncio.TimeoutError))
            raise translate_error(exc, request, connecting) from exc
        return httpx.Response(answer.status, headers=list(answer.raw_headers), stream=stream, request=request)

    async def fetch(
        self,
        method: str,
        url: str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request without httpx: (status, headers, whole body). Errors are httpx's.

        httpx's own request building (URL merging and parsing, header models, the response
        stream) costs about 0.3 ms of CPU per call, more than aiohttp's whole request; the
        store client's calls are small and many, so it comes here directly.
        """
        limits = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        try:
            async with self._session_now().request(
                method, url, data=content, headers=headers, params=params, timeout=limits, allow_redirects=False
            ) as answer:
                return answer.status, answer.headers, await answer.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            connecting = isinstance(exc, aiohttp.ClientConnectorError)
            raise translate_error(exc, httpx.Request(method, url), connecting) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
