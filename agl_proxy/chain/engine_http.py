"""A lean HTTP/1.1 client for the token chain's JSON requests to the engine.

A bridged call makes three or four engine requests (one or two renders, generate, derender),
each a small JSON POST answered whole. aiohttp's request machinery (session, timeout objects,
header multidicts, response objects) cost about 170 µs of proxy CPU per request on this path;
this client writes the request head itself and reads the answer with asyncio's streams, about
80 µs (`benchmarks/chain_bench.py` prints both). Connections are kept alive per host and
dropped once idle for longer than the server keeps them. Errors are httpx's, as the rest of
the proxy handles them (`forwarding.backend_failures`).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

import httpx

from agl_store.web.http_transport import UVICORN_KEEPALIVE_S

_MAX_IDLE_PER_HOST = 64
_NO_BODY_STATUSES = (204, 304)
Origin = tuple[str, str, int]


class _Connection:
    __slots__ = ("epoch", "idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, epoch: int) -> None:
        self.reader = reader
        self.writer = writer
        self.epoch = epoch
        self.idle_since = 0.0

    def close(self) -> None:
        self.writer.close()


class _Answer:
    __slots__ = ("body", "headers", "keep", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes, keep: bool) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.keep = keep


class EngineHttp:
    """POSTs JSON to engines over kept-alive HTTP/1.1 connections; `fetch` as
    `AiohttpTransport.fetch` (status, headers with lower-case names, whole body)."""

    def __init__(self, keepalive_s: float = UVICORN_KEEPALIVE_S - 1.0) -> None:
        self.keepalive_s = keepalive_s
        self._idle: dict[Origin, list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._epoch = 0
        """Counts `aclose` calls: a connection opened before the last one is closed once its request ends."""

    async def fetch(
        self,
        method: str,
        url: str,
        *,
        content: bytes = b"",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request; raises httpx's `ConnectError`, `ConnectTimeout`, `ReadTimeout`,
        `RemoteProtocolError` (the server closed the connection or answered garbage) or `ReadError`."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise httpx.UnsupportedProtocol(f"cannot POST to {url!r}: not an http(s) URL")
        port = parts.port or (443 if scheme == "https" else 80)
        origin = (scheme, parts.hostname, port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = _request_head(method, target, parts.netloc, headers or {}, len(content)) + content
        # A kept-alive connection the server closed meanwhile fails before any answer: once
        # more on a new connection (the server never read that request).
        for reused in (True, False):
            connection = self._take(origin) if reused else None
            if reused and connection is None:
                continue
            if connection is None:
                connection = await self._connect(origin, url, timeout)
            try:
                answer = await _exchange(connection, request, timeout, url)
            except _ClosedBeforeAnswer as exc:
                connection.close()
                if reused:
                    continue
                raise httpx.RemoteProtocolError(f"{url}: the server closed the connection") from exc
            except BaseException:
                connection.close()
                raise
            if answer.keep:
                self._put(origin, connection)
            else:
                connection.close()
            return answer.status, answer.headers, answer.body
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Close the idle connections; those in use close when their request ends."""
        self._epoch += 1
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()
        for connections in idle.values():
            for connection in connections:
                try:
                    await connection.writer.wait_closed()
                except OSError:
                    pass

    @property
    def idle_connections(self) -> int:
        return sum(len(c) for c in self._idle.values())

    def _take(self, origin: Origin) -> _Connection | None:
        connections = self._idle.get(origin)
        now = time.monotonic()
        while connections:
            connection = connections.pop()
            if now - connection.idle_since < self.keepalive_s and not connection.reader.at_eof():
                return connection
            connection.close()
        return None

    def _put(self, origin: Origin, connection: _Connection) -> None:
        connections = self._idle.setdefault(origin, [])
        if len(connections) >= _MAX_IDLE_PER_HOST or connection.epoch != self._epoch:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        connections.append(connection)

    async def _connect(self, origin: Origin, url: str, timeout: float | None) -> _Connection:
        scheme, host, port = origin
        context: ssl.SSLContext | None = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, ssl=context)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"{url}: no connection within {timeout:g} s") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"{url}: {exc}") from exc
        return _Connection(reader, writer, self._epoch)


class _ClosedBeforeAnswer(Exception):
    """The connection ended before any byte of the answer."""


def _request_head(method: str, target: str, host: str, headers: Mapping[str, str], length: int) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"host: {host}", f"content-length: {length}"]
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n") or ":" in name:
            raise httpx.LocalProtocolError(f"header {name!r}: a line break or colon cannot be sent")
        if name.lower() not in ("host", "content-length"):
            lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _exchange(connection: _Connection, request: bytes, timeout: float | None, url: str) -> _Answer:
    reader = connection.reader
    try:
        async with asyncio.timeout(timeout):
            try:
                connection.writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise _ClosedBeforeAnswer from exc
                raise
            except (ConnectionResetError, BrokenPipeError) as exc:
                raise _ClosedBeforeAnswer from exc
            answer = _parse_head(head, url)
            if answer.status in _NO_BODY_STATUSES:
                return answer
            length = answer.headers.get("content-length")
            if length is not None:
                answer.body = await reader.readexactly(_int(length, url))
            elif "chunked" in answer.headers.get("transfer-encoding", "").lower():
                answer.body = await _read_chunked(reader, url)
            else:
                answer.body = await reader.read()
                answer.keep = False
            return answer
    except TimeoutError as exc:
        raise httpx.ReadTimeout(f"{url}: no answer within {timeout:g} s") from exc
    except asyncio.IncompleteReadError as exc:
        raise httpx.RemoteProtocolError(f"{url}: the server closed the connection mid-answer") from exc
    except asyncio.LimitOverrunError as exc:
        raise httpx.RemoteProtocolError(f"{url}: an answer's header or chunk line is too long") from exc
    except OSError as exc:
        raise httpx.ReadError(f"{url}: {exc}") from exc


def _parse_head(head: bytes, url: str) -> _Answer:
    lines = head[:-4].decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
        raise httpx.RemoteProtocolError(f"{url}: not an HTTP/1.1 answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise httpx.RemoteProtocolError(f"{url}: a malformed header line: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep = connection != "close" and (status_line[0] != "HTTP/1.0" or connection == "keep-alive")
    return _Answer(int(status_line[1]), headers, b"", keep)


async def _read_chunked(reader: asyncio.StreamReader, url: str) -> bytes:
    parts: list[bytes] = []
    while True:
        line = await reader.readuntil(b"\r\n")
        size = _int(line.split(b";", 1)[0].strip(), url, 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailers
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise httpx.RemoteProtocolError(f"{url}: a chunk without its line end")


def _int(text: str | bytes, url: str, base: int = 10) -> int:
    try:
        value = int(text, base)
    except ValueError:
        value = -1
    if value < 0:
        raise httpx.RemoteProtocolError(f"{url}: a malformed length {text!r}")
    return value
