"""Which earlier call of an attempt a chat call continues, and if none, why not.

`decide` takes the calls the chain remembers (`ChainEntry`, oldest first) and the new
request's digests (`chain_messages.RequestKeys`) and returns a `Link`: `retry` (the same
prompt as an earlier call), `bridged` (an earlier call's messages, then the proxy's answer
to it as the client echoed it, then new messages), or `branched` / `rendered` with the
cause `agl_store.call_span.CallChain` names.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from agl_store.call_span import CallChain

from .chain_messages import Answer, Digest, RequestKeys, shared_prefix


@dataclass(frozen=True, slots=True)
class ChainChoice:
    """One choice of a remembered call: its generated ids and the answer the proxy gave."""

    token_ids: array[int]
    answer: Answer


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """What the chain keeps of one answered chat call."""

    span_id: str
    full: tuple[Digest, ...]
    plain: tuple[Digest, ...]
    tools: Digest
    template: Digest
    prompt_key: Digest
    system_first: bool
    """The first message is a system (or developer) message."""
    prompt_ids: array[int]
    choices: tuple[ChainChoice, ...]

    @property
    def size(self) -> int:
        """What it costs to keep, in ids and digests: the memory bound counts this."""
        return len(self.prompt_ids) + sum(len(c.token_ids) for c in self.choices) + 2 * len(self.full)


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


def decide(entries: Sequence[ChainEntry], keys: RequestKeys) -> Link:
    """The link of a request to the remembered calls (`entries`, oldest first)."""
    if not entries:
        return FIRST_CALL
    prompt_key = keys.prompt
    for entry in reversed(entries):
        if entry.prompt_key == prompt_key:
            return Link("retry", parent=entry)
    # The call it continues is the one with the longest history: an earlier call of the same
    # line is a prefix too.
    bridged: Link | None = None
    for entry in reversed(entries):
        if bridged is None or len(entry.full) > len(bridged.parent.full):  # type: ignore[union-attr]
            bridged = _bridge(entry, keys) or bridged
    return bridged if bridged is not None else _branch(entries, keys)


def _bridge(entry: ChainEntry, keys: RequestKeys) -> Link | None:
    n = len(entry.full)
    if len(keys.full) <= n or keys.full[:n] != entry.full:
        return None
    if entry.tools != keys.tools or entry.template != keys.template:
        return None
    echoed = keys.messages[n]
    for index, choice in enumerate(entry.choices):
        if choice.answer.matches(echoed):
            return Link("bridged", parent=entry, choice=index, new_from=n + 1)
    return None


def _branch(entries: Sequence[ChainEntry], keys: RequestKeys) -> Link:
    best, shared, whole = None, 0, False
    for entry in reversed(entries):
        common = shared_prefix(entry.full, keys.full)
        # Of equal prefixes, the call whose whole history is repeated says best what changed (its answer).
        if common > shared or (common == shared > 0 and not whole and common == len(entry.full)):
            best, shared, whole = entry, common, common == len(entry.full)
    if best is None:
        # Not even the first message is shared.
        system = keys.system_first or entries[-1].system_first
        return Link("branched", cause="system_changed" if system else "history_edited")
    return Link("branched", parent=best, cause=_cause(best, keys, shared))


def _cause(entry: ChainEntry, keys: RequestKeys, shared: int) -> str:
    if entry.tools != keys.tools:
        return "tools_changed"
    if entry.template != keys.template:
        return "template_changed"
    if shared < len(entry.full):
        if shared == len(keys.full):
            return "history_shortened"
        if entry.plain[shared] == keys.messages[shared].plain:
            return "reasoning_dropped"
        return "history_edited"
    # The whole history repeated; the echoed answer is not the proxy's (or there is none).
    return "answer_changed" if len(keys.full) > shared else "history_shortened"
