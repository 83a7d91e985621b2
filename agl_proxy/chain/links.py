"""Which earlier call of an attempt a chat call continues, and if none, why not.

`decide` takes the calls the chain remembers (`ChainEntry`) and the new request's digests
(`digests.RequestKeys`) and returns a `Link`: `retry` (the same request as an earlier call:
its prompt is reused; whether the repeat replaced that call or is a sample beside it, only the
whole attempt shows, and the trainer's call graph decides), `bridged` (an earlier call's
messages, then the proxy's answer to it as the client echoed it, then new messages), or
`branched` / `rendered` with the cause `agl_store.call_span.CallChain` names (`multimodal`: a
call that would be bridged but holds media). `quick_link` finds a retry or a bridge from the
request's JSON as sent, digesting only the messages after the parent's.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agl_store.call_span import CallChain

from .digests import Answer, RequestKeys, context_keys, message_keys, messages_of, raw_json, shared_prefix


@dataclass(frozen=True, slots=True)
class ChainChoice:
    """One choice of a remembered call: its generated ids and the answer the proxy gave."""

    token_ids: array[int]
    answer: Answer


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """What the chain keeps of one answered chat call."""

    span_id: str
    keys: RequestKeys
    prompt_ids: array[int]
    choices: tuple[ChainChoice, ...]
    root_prompt_len: int
    """The prompt length of the call that started this call's training row (`row_budget`)."""

    @property
    def size(self) -> int:
        """What it costs to keep, in ids and digests: the memory bound counts this."""
        return len(self.prompt_ids) + sum(len(c.token_ids) for c in self.choices) + 3 * len(self.keys.messages)


@dataclass(frozen=True, slots=True)
class Link:
    """How a call's prompt is made."""

    kind: str
    """`bridged`, `retry`, `branched` or `rendered` (`CallChain.prompt`)."""
    parent: ChainEntry | None = None
    choice: int | None = None
    cause: str | None = None
    new_from: int = 0
    """For `bridged`: the index of the first message after the echoed answer."""

    def attribute(self) -> CallChain:
        return {
            "prompt": self.kind,
            "parent": self.parent.span_id if self.parent is not None else None,
            "choice": self.choice,
            "cause": self.cause,
        }


FIRST_CALL = Link("rendered", cause="first_call")


def quick_link(entries: Sequence[ChainEntry], body: Mapping[str, Any]) -> tuple[Link, RequestKeys] | None:
    """A retry or a bridge whose parent's messages the request repeats as the same JSON, with the
    request's keys; None when there is none (`decide` on all the digests then says what holds)."""
    messages = messages_of(body)
    tools, template = context_keys(body)
    same_context = [e for e in entries if e.keys.tools == tools and e.keys.template == template]
    raw, repeated = raw_json(messages, [e.keys.raw for e in same_context])
    for entry in same_context:
        if entry.keys.raw == raw:
            return Link("retry", parent=entry), entry.keys
    # The longest repeated history first: an earlier call of the same line is repeated too.
    by_raw = {id(e.keys.raw): e for e in same_context}
    for prefix in reversed(repeated):
        entry = by_raw[id(prefix)]
        n = len(entry.keys.messages)
        echoed = message_keys(messages[n])
        for index, choice in enumerate(entry.choices):
            if choice.answer.matches(echoed):
                keys = entry.keys.extended(messages, raw)
                if keys.multimodal:
                    return None  # never bridged: `decide` names the cause
                return Link("bridged", parent=entry, choice=index, new_from=n + 1), keys
    return None


def decide(entries: Sequence[ChainEntry], keys: RequestKeys) -> Link:
    """The link of a request to the remembered calls (`entries`, oldest first)."""
    if not entries:
        return FIRST_CALL
    prompt_key = keys.prompt
    for entry in reversed(entries):
        if entry.keys.prompt == prompt_key:
            return Link("retry", parent=entry)
    # The call it continues is the one with the longest history: an earlier call of the same
    # line is a prefix too.
    bridged: Link | None = None
    for entry in sorted(entries, key=lambda e: len(e.keys.messages), reverse=True):
        bridged = _bridge(entry, keys)
        if bridged is not None:
            # The bridged prompt would hold the media's placeholder ids, and generate would get no
            # features for them: rendered whole, the engine makes both.
            return Link("branched", parent=entry, cause="multimodal") if keys.multimodal else bridged
    return _branch(entries, keys)


def _bridge(entry: ChainEntry, keys: RequestKeys) -> Link | None:
    parent = entry.keys
    n = len(parent.full)
    if len(keys.full) <= n or keys.full[:n] != parent.full:
        return None
    if parent.tools != keys.tools or parent.template != keys.template:
        return None
    echoed = keys.messages[n]
    for index, choice in enumerate(entry.choices):
        if choice.answer.matches(echoed):
            return Link("bridged", parent=entry, choice=index, new_from=n + 1)
    return None


def _branch(entries: Sequence[ChainEntry], keys: RequestKeys) -> Link:
    best, shared, whole = None, 0, False
    for entry in reversed(entries):
        common = shared_prefix(entry.keys.full, keys.full)
        # Of equal prefixes, the call whose whole history is repeated says best what changed (its answer).
        complete = common == len(entry.keys.full)
        if common > shared or (common == shared > 0 and not whole and complete):
            best, shared, whole = entry, common, complete
    if best is None:
        # Not even the first message is shared.
        system = keys.system_first or entries[-1].keys.system_first
        return Link("branched", cause="system_changed" if system else "history_edited")
    return Link("branched", parent=best, cause=_cause(best.keys, keys, shared))


def _cause(parent: RequestKeys, keys: RequestKeys, shared: int) -> str:
    if parent.tools != keys.tools:
        return "tools_changed"
    if parent.template != keys.template:
        return "template_changed"
    if shared < len(parent.full):
        if shared == len(keys.full):
            return "history_shortened"
        if parent.messages[shared].plain == keys.messages[shared].plain:
            return "reasoning_dropped"
        return "history_edited"
    # The whole history repeated; the echoed answer is not the proxy's (or there is none).
    return "answer_changed" if len(keys.full) > shared else "history_shortened"
