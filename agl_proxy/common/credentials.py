"""Secrets in a deployment's settings: which fields they are, masking them, moving URL userinfo into a header.

A `model_list` entry's `litellm_params` mixes request defaults (`temperature`) with connection
settings and credentials (`api_key`, `aws_secret_access_key`, `vertex_credentials`,
`extra_headers`, a password in `api_base`). Only the former may reach spans or a backend's
JSON body; the latter are masked wherever the proxy shows its configuration.
"""

from __future__ import annotations

import base64
import re
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
# A field is secret when its last word is one of these (`api_key`, `aws_session_token`, `extra_headers`,
# `auth`), or it mentions one of the others anywhere (`client_secret`, `vertex_credentials`).
# Only the last word for `token`: `stop_token_ids` and `max_tokens` are sampling parameters.
_SECRET_LAST_WORDS = frozenset({"key", "token", "auth", "authorization", "cookie", "signature", "apikey", "headers"})
_SECRET_WORDS = frozenset(
    {"secret", "secrets", "password", "passwd", "pwd", "credential", "credentials", "authorization"}
)
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


def is_secret_name(name: str) -> bool:
    """True for field and header names that hold credentials (`api_key`, `X-Api-Key`, `aws_secret_access_key`)."""
    words = [w for w in _WORD_SPLIT.split(name.lower()) if w]
    return bool(words) and (words[-1] in _SECRET_LAST_WORDS or any(w in _SECRET_WORDS for w in words))


def mask_secrets(value: Any) -> Any:
    """`value` with every secret-named field masked, at any depth, and URL passwords masked."""
    if isinstance(value, dict):
        return {k: MASK if is_secret_name(str(k)) and v else mask_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v) for v in value]
    if isinstance(value, str) and "@" in value and "://" in value:
        return mask_url_password(value)
    return value


def mask_url_password(url: str) -> str:
    """`http://user:pw@host/v1` -> `http://user:***@host/v1`; other strings unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{MASK}@{host}"))


def check_http_url(url: Any, field: str) -> str:
    """`url` if it is an http(s) URL with a host and no whitespace or control characters.

    Anything else is a ValueError naming `field`.
    """
    if not isinstance(url, str) or not url:
        raise ValueError(f"{field} must be an http(s) URL, got {url!r}")
    if _CONTROL.search(url):
        raise ValueError(f"{field} must not contain spaces or control characters (CR, LF, ...): {url[:200]!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ValueError(f"{field} is not a valid URL ({exc}): {mask_url_password(url)[:200]!r}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"{field} must use http or https, not {parts.scheme or 'no scheme'!r}")
    if not parts.hostname:
        raise ValueError(f"{field} has no host: {mask_url_password(url)[:200]!r}")
    return url


def split_userinfo(url: str) -> tuple[str, str | None]:
    """(`url` without `user:password@`, the `Authorization: Basic ...` value it stood for, or None)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    return urlunsplit(parts._replace(netloc=host)), f"Basic {token}"
