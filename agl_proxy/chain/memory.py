"""The calls the token chain remembers, per attempt, bounded, and read back from the store.

Any proxy of a fleet may serve any call of an attempt: a call that continues nothing this
proxy remembers has the attempt's call spans read from the store (through the
LightningStore interface) before it is taken as a branch. What is kept is bounded per
attempt (the most recently used calls) and in total (ids and digests, least recently used
attempts dropped first). Each call keeps the prompt length of its row's first call (the row
budget's base, `row_budget`); read from the store it follows the spans' `agl.chain` links.
"""

from __future__ import annotations

import logging
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from agl_store import call_span
from agl_store.base import LightningStore
from agl_store.models import Span

from ..common.errors import BadRequestError
from ..translate.base import ClientApi
from ..translate.messages import MESSAGES
from ..translate.responses import RESPONSES
from .digests import Answer, RequestKeys, messages_of, request_keys
from .links import ChainChoice, ChainEntry, Link, decide, quick_link

logger = logging.getLogger(__name__)

DEFAULT_PER_ATTEMPT = 32
DEFAULT_MAX_SIZE = 4_000_000
"""Ids and digests kept in all (about 4 bytes per id): tens of MB at most."""
_SPAN_ATTRIBUTES = (
    call_span.API,
    call_span.REQUEST,
    call_span.RESPONSE,
    call_span.PROMPT_TOKEN_IDS,
    call_span.CHOICES,
    call_span.CHAIN,
)
_CONTINUING = ("bridged", "retry")
"""The `agl.chain` kinds whose call stays in its parent's row."""
_TRANSLATED: dict[str, ClientApi] = {api.name: api for api in (RESPONSES, MESSAGES)}
"""The client APIs whose spans keep the client's request (their response is the chat answer)."""


def chain_entry(
    span_id: str,
    keys: RequestKeys,
    prompt_ids: Sequence[int],
    choices: Sequence[tuple[Sequence[int], Mapping[str, Any]]],
    root_prompt_len: int | None = None,
) -> ChainEntry:
    """The chain's record of an answered call: its request's digests, its prompt ids, per
    choice the generated ids and the answer message the client got, and the prompt length of
    its row's first call (its own when None: the call starts a row)."""
    return ChainEntry(
        span_id=span_id,
        keys=keys,
        # An array is the chain's own (a bridge joined kept ids into it): kept as it is.
        prompt_ids=prompt_ids if isinstance(prompt_ids, array) else array("l", prompt_ids),
        choices=tuple(ChainChoice(array("l", ids), Answer.of(message)) for ids, message in choices),
        root_prompt_len=len(prompt_ids) if root_prompt_len is None else root_prompt_len,
    )


def _chat_request(api: Any, request: Any, defaults: Mapping[str, Any]) -> dict[str, Any] | None:
    """The chat request a stored call's engine rendered: the span's own for chat completions
    (kept with the deployment's defaults applied); a Responses or Messages span keeps the client's
    request, translated again as when it was served (the translation is a pure function of the
    request), under the deployment's request `defaults` as the chain served it."""
    if api == "chat.completions":
        return request if isinstance(request, dict) else None
    translator = _TRANSLATED.get(api) if isinstance(api, str) else None
    if translator is None or not isinstance(request, dict):
        return None
    try:
        return {**defaults, **translator.chat_request(request)}
    except BadRequestError:
        return None


def root_prompt_lengths(spans: Sequence[Span]) -> dict[str, int]:
    """Per call span (in call order), the prompt length of its row's first call: a bridged or
    retried call's parent's, else its own (also when the parent is not among `spans`)."""
    roots: dict[str, int] = {}
    for span in spans:
        chain = span.attributes.get(call_span.CHAIN)
        prompt_ids = span.attributes.get(call_span.PROMPT_TOKEN_IDS) or ()
        parent = chain.get("parent") if isinstance(chain, Mapping) and chain.get("prompt") in _CONTINUING else None
        roots[span.span_id] = roots.get(parent, len(prompt_ids)) if isinstance(parent, str) else len(prompt_ids)
    return roots


def entry_of_span(
    span: Span, root_prompt_len: int | None = None, defaults: Mapping[str, Any] | None = None
) -> ChainEntry | None:
    """The chain's record of a stored call span, a translated call's request under the deployment's
    request `defaults`; None for a span the chain cannot continue (failed, no token ids, or an API
    whose request is not a chat request nor translates to one)."""
    attrs = span.attributes
    if span.status.status_code == "ERROR":
        return None
    request = _chat_request(attrs.get(call_span.API), attrs.get(call_span.REQUEST), defaults or {})
    response = attrs.get(call_span.RESPONSE)
    prompt_ids, stored = attrs.get(call_span.PROMPT_TOKEN_IDS), attrs.get(call_span.CHOICES)
    if not isinstance(request, dict) or not isinstance(response, dict) or not prompt_ids or not stored:
        return None
    messages = {c.get("index", i): c.get("message") for i, c in enumerate(response.get("choices") or ())}
    choices = []
    for i, choice in enumerate(stored):
        ids, message = choice.get("token_ids"), messages.get(choice.get("index", i))
        if not ids or not isinstance(message, dict):
            return None
        choices.append((ids, message))
    return chain_entry(span.span_id, request_keys(request), prompt_ids, choices, root_prompt_len)


def _final(link: Link, body: Mapping[str, Any]) -> bool:
    """A retry, or a bridge whose new messages hold no assistant message: none that a later
    call (another proxy's) may have answered is skipped, so the store need not be read."""
    if link.kind == "retry":
        return True
    new = messages_of(body)[link.new_from :]
    return link.kind == "bridged" and not any(isinstance(m, Mapping) and m.get("role") == "assistant" for m in new)


class _AttemptCalls:
    __slots__ = ("entries", "size")

    def __init__(self) -> None:
        self.entries: OrderedDict[str, ChainEntry] = OrderedDict()
        self.size = 0


class ChainMemory:
    """The remembered calls of every attempt this proxy served, with the store behind them."""

    def __init__(
        self,
        store: LightningStore | None,
        per_attempt: int = DEFAULT_PER_ATTEMPT,
        max_size: int = DEFAULT_MAX_SIZE,
    ) -> None:
        if per_attempt < 1 or max_size < 1:
            raise ValueError(f"per_attempt and max_size must be >= 1, got {per_attempt} and {max_size}")
        self.store = store
        self.per_attempt = per_attempt
        self.max_size = max_size
        self.size = 0
        self.store_reads = 0
        self._attempts: OrderedDict[tuple[str, str], _AttemptCalls] = OrderedDict()

    @property
    def entries(self) -> int:
        return sum(len(a.entries) for a in self._attempts.values())

    async def link(
        self, rollout_id: str, attempt_id: str, body: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
    ) -> tuple[Link, RequestKeys]:
        """How a call of the attempt with request `body` is made, and the request's digests:
        from memory, else after reading the attempt's calls from the store (`defaults`: the
        deployment's request defaults, which `body` holds and a translated span's request lacks)."""
        key = (rollout_id, attempt_id)
        calls = self._attempts.get(key)
        entries = list(calls.entries.values()) if calls is not None else []
        found = quick_link(entries, body)
        if found is not None and _final(found[0], body):
            self._touch(key, found[0])
            return found
        keys = request_keys(body)
        link = decide(entries, keys) if entries else None
        if link is not None and _final(link, body):
            self._touch(key, link)
            return link, keys
        if self.store is not None and rollout_id and await self._read_store(key, defaults or {}):
            link = decide(list(self._attempts[key].entries.values()), keys)
            self._touch(key, link)
        return (link if link is not None else decide((), keys)), keys

    def remember(self, rollout_id: str, attempt_id: str, entry: ChainEntry) -> None:
        """Keep an answered call, dropping the least recently used ones past the bounds."""
        key = (rollout_id, attempt_id)
        calls = self._attempts.get(key)
        if calls is None:
            calls = self._attempts[key] = _AttemptCalls()
        self._attempts.move_to_end(key)
        old = calls.entries.pop(entry.span_id, None)
        if old is not None:
            calls.size -= old.size
            self.size -= old.size
        calls.entries[entry.span_id] = entry
        calls.size += entry.size
        self.size += entry.size
        while len(calls.entries) > self.per_attempt:
            self._drop_oldest(calls)
        while self.size > self.max_size and self._attempts:
            oldest_key, oldest = next(iter(self._attempts.items()))
            if oldest is calls and len(calls.entries) == 1:
                break  # the call just kept stays, however large
            self._drop_oldest(oldest)
            if not oldest.entries:
                del self._attempts[oldest_key]

    def _drop_oldest(self, calls: _AttemptCalls) -> None:
        _, entry = calls.entries.popitem(last=False)
        calls.size -= entry.size
        self.size -= entry.size

    def _touch(self, key: tuple[str, str], link: Link) -> None:
        calls = self._attempts.get(key)
        if calls is None:
            return
        self._attempts.move_to_end(key)
        if link.parent is not None and link.parent.span_id in calls.entries:
            calls.entries.move_to_end(link.parent.span_id)

    async def _read_store(self, key: tuple[str, str], defaults: Mapping[str, Any]) -> bool:
        """Add the attempt's stored calls this proxy does not hold; True when some were added."""
        assert self.store is not None
        rollout_id, attempt_id = key
        self.store_reads += 1
        try:
            page = await self.store.query_spans(
                rollout_id, attempt_id or "latest", name=call_span.NAME, attributes=_SPAN_ATTRIBUTES
            )
        except Exception as exc:  # the call is rendered whole instead; nothing is lost but the bridge
            logger.warning("agl_proxy: cannot read the calls of attempt %r from the store: %r", attempt_id, exc)
            return False
        calls = self._attempts.get(key)
        known = set(calls.entries) if calls is not None else set()
        added = False
        spans = list(page)
        roots = root_prompt_lengths(spans)
        for span in spans[-self.per_attempt :]:
            if span.span_id in known:
                continue
            entry = entry_of_span(span, roots[span.span_id], defaults)
            if entry is not None:
                self.remember(rollout_id, attempt_id, entry)
                added = True
        return added
