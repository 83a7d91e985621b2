"""Protections against web pages: no cross-site writes, no DNS rebinding, no content sniffing.

A page the user visits in a browser can send requests to a server on the user's machine
(`http://127.0.0.1:4747`). Without a key nothing else stops it, so, as Jupyter does:

- writes (POST, PUT, PATCH) must declare a JSON body (`application/json` or `...+json`), or
  one of the types a route lists for itself (packed spans), unless the route checks its
  type itself (OTLP's protobuf or JSON); a write without a body passes, whatever type it claims.
  Browsers send the types a form can (`text/plain`, ...) without asking the server first;
  they ask before sending JSON, and no agl server says yes.
- without a key, a request whose `Origin` is not the server's own (`Host`) is refused;
- without a key and bound to a loopback address, a request whose `Host` is not a loopback
  name (`localhost`, `127.0.0.1`, `[::1]`, any port) is refused: a page that rebinds its
  own host name to 127.0.0.1 sends its own name as `Host`.

Every answer also gets `X-Content-Type-Options: nosniff`, so a browser never runs a JSON
body (which may echo user text) as HTML or script.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection, Mapping
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .wire import JSON_MEDIA_TYPE, error_body

Renderer = Callable[[str, str], bytes]
"""The JSON body of a refusal, given its code and message."""

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH"})
NOSNIFF = (b"x-content-type-options", b"nosniff")


def is_loopback(host: str) -> bool:
    """True for `localhost`, `127.x.y.z` and `::1` (brackets and a port allowed: `[::1]:80`)."""
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def media_type(value: str) -> str:
    """`application/json; charset=utf-8` -> `application/json`."""
    return value.partition(";")[0].strip().lower()


def is_json(kind: str) -> bool:
    """`application/json`, or a JSON-based type such as `application/merge-patch+json`."""
    return kind == JSON_MEDIA_TYPE or (kind.startswith("application/") and kind.endswith("+json"))


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


class CrossSiteGuard:
    """Pure ASGI middleware applying the checks above.

    `keyless`: the routes behind it need no key (turns on the Origin check, and with
    `loopback` the Host check). `media_types` lists, per path, the body types a write may
    have instead of JSON; None for a route that checks its body's type itself.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        keyless: bool,
        loopback: bool,
        media_types: Mapping[str, Collection[str] | None] | None = None,
        render: Renderer = error_body,
    ) -> None:
        self.app = app
        self.check_origin = keyless
        self.check_host = keyless and loopback
        self.media_types = {
            path: None if types is None else frozenset(types) for path, types in (media_types or {}).items()
        }
        self._render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await self._refuse(send, *refusal)
            return

        async def send_nosniff(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == NOSNIFF[0] for name, _ in headers):
                    message["headers"] = [*headers, NOSNIFF]
            await send(message)

        await self.app(scope, receive, send_nosniff)

    def _refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """(status, code, message) when the request must be refused, else None."""
        host = _header(scope, b"host")
        if self.check_host and host is not None and not is_loopback(host):
            return (
                403,
                "forbidden_host",
                f"Host {host!r} refused: this server has no key and listens on a loopback address, so it "
                "answers only to localhost, 127.0.0.1 or [::1] (start it with a key to serve other names)",
            )
        origin = _header(scope, b"origin")
        if self.check_origin and origin is not None and urlsplit(origin).netloc.lower() != (host or "").lower():
            return (
                403,
                "cross_origin",
                f"cross-origin request from {origin[:200]!r} refused: this server has no key, so only "
                "its own pages may call it from a browser",
            )
        checks_itself = scope["path"] in self.media_types and self.media_types[scope["path"]] is None
        if scope["method"] in WRITE_METHODS and not checks_itself:
            return self._media_type_refusal(scope)
        return None

    def _media_type_refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        declared = _header(scope, b"content-type")
        length = _header(scope, b"content-length")
        if _header(scope, b"transfer-encoding") is None and (length == "0" or (length is None and declared is None)):
            return None  # no body at all, whatever type it claims (aiohttp says octet-stream for `json=None`)
        if declared is None:
            declared = ""
        kind = media_type(declared)
        allowed = self.media_types.get(scope["path"])
        accepted = is_json(kind) if allowed is None else kind in allowed
        if accepted:
            return None
        expected = " or ".join(sorted(allowed)) if allowed is not None else JSON_MEDIA_TYPE
        return (
            415,
            "unsupported_media_type",
            f"Content-Type {declared[:100]!r} refused: {scope['method']} {scope['path']} takes {expected}",
        )

    async def _refuse(self, send: Send, status: int, code: str, message: str) -> None:
        body = self._render(code, message)
        headers: list[tuple[bytes, bytes]] = [
            (b"content-type", JSON_MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            NOSNIFF,
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
