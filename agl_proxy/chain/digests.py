"""How the token chain compares chat messages: each message reduced to a digest of what a
chat template renders of it, so a call's history is checked against an earlier call's in
one tuple comparison.

What counts (the comparison rules docs/proxy.md lists): role, content (None, "" and a list
of text parts that joins to the same string are equal), name, tool_call_id, and the tool
calls' function names with their arguments compared as parsed JSON (the calls' own ids and
the order of JSON keys aside); reasoning (`reasoning` or `reasoning_content`) counts in the
full digest and is left out of the plain one, so an echoed answer is compared on its
reasoning only where the client sent it back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

try:  # vLLM's dependency: 5x blake2b's speed on a long history's JSON, which every call hashes
    import blake3
except ImportError:  # pragma: no cover - a proxy host without vLLM's packages
    blake3 = None  # type: ignore[assignment]

Digest = bytes

SYSTEM_ROLES = ("system", "developer")
TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"})
"""The content part types vLLM renders as text; any other part (an image, audio, a video) is media,
which the engine renders as placeholder ids and hands generate as features."""
REASONING_KEYS = ("reasoning", "reasoning_content")
TEMPLATE_FIELDS = (
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "documents",
    "reasoning_effort",
    "tool_choice",
    "response_format",
    "mm_processor_kwargs",
    "media_io_kwargs",
)
"""Request fields besides the messages and tools that change what vLLM renders: those its chat
request hands the renderer (`ChatCompletionRequest.build_chat_params`; `reasoning_effort` also
sets the template's `enable_thinking`, and some renderers write `tool_choice` and
`response_format` into the prompt), and the media processing options."""


def digest(value: Any) -> Digest:
    """A short fingerprint of a JSON value, the same for equal values whatever their key order."""
    return hashlib.blake2b(orjson.dumps(value, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()


def _content(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in value):
        return "".join(str(p.get("text") or "") for p in value)
    return value


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _tool_calls(value: Any) -> list[Any]:
    out: list[Any] = []
    for call in value or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            out.append(call)
            continue
        out.append([function.get("name"), _arguments(function.get("arguments"))])
    return out


def has_media(content: Any) -> bool:
    """Whether a message's content holds a part other than text (`TEXT_PARTS`)."""
    return isinstance(content, list) and any(
        isinstance(p, Mapping) and p.get("type") not in TEXT_PARTS for p in content
    )


def reasoning_of(message: Mapping[str, Any]) -> str | None:
    """The message's reasoning text, whichever key carries it; None when it has none."""
    for key in REASONING_KEYS:
        value = message.get(key)
        if value:
            return str(value)
    return None


def plain_form(message: Mapping[str, Any]) -> dict[str, Any]:
    """What of `message` a template renders, reasoning left out."""
    form: dict[str, Any] = {"role": message.get("role"), "content": _content(message.get("content"))}
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            form[key] = message[key]
    calls = _tool_calls(message.get("tool_calls"))
    if calls:
        form["tool_calls"] = calls
    return form


@dataclass(frozen=True, slots=True)
class MessageKeys:
    """The digests of one message: `full` (reasoning included) and `plain` (reasoning left out)."""

    full: Digest
    plain: Digest
    reasoning: Digest | None
    media: bool = False
    """Its content holds media (`has_media`)."""


def message_keys(message: Any) -> MessageKeys:
    """The digests of one chat message (a message that is not a JSON object is digested as it is)."""
    if not isinstance(message, Mapping):
        whole = digest(message)
        return MessageKeys(whole, whole, None)
    plain = plain_form(message)
    reasoning = reasoning_of(message)
    media = has_media(message.get("content"))
    if reasoning is None:
        key = digest(plain)
        return MessageKeys(key, key, None, media)
    return MessageKeys(digest({**plain, "reasoning": reasoning}), digest(plain), digest(reasoning), media)


@dataclass(frozen=True, slots=True)
class Answer:
    """What the proxy answered in one choice, as the echoed assistant message is compared with it."""

    plain: Digest
    reasoning: Digest | None

    @classmethod
    def of(cls, message: Mapping[str, Any]) -> Answer:
        keys = message_keys({**message, "role": "assistant"})
        return cls(keys.plain, keys.reasoning)

    def matches(self, echoed: MessageKeys) -> bool:
        """The client's echo of this answer: equal without reasoning, and equal reasoning where it sent some."""
        if echoed.plain != self.plain:
            return False
        return echoed.reasoning is None or echoed.reasoning == self.reasoning


@dataclass(frozen=True, slots=True)
class RawJson:
    """Digests of a message list's JSON (keys sorted): `whole`, and `open`, all but its closing
    `]`, which a longer list starting with the same messages starts with, then a `,`."""

    whole: Digest
    open: Digest
    length: int


@dataclass(frozen=True, slots=True)
class RequestKeys:
    """The digests of one chat request, as the chain compares calls."""

    messages: tuple[MessageKeys, ...]
    tools: Digest
    template: Digest
    """The other fields that change the rendering (`TEMPLATE_FIELDS`)."""
    system_first: bool
    """The first message is a system (or developer) message."""
    raw: RawJson
    """The messages' JSON as sent (keys sorted): a later call repeating it is checked in one
    comparison, its messages digested only from there on."""
    full: tuple[Digest, ...]
    """Each message's full digest: the history a later call must repeat."""
    prompt: Digest = field(init=False)
    """Equal for requests a template renders to the same prompt: a repeat of such a call is a retry."""
    multimodal: bool = field(init=False)
    """Some message holds media: its prompt is never bridged (generate would get no features for it)."""

    def __post_init__(self) -> None:
        prompt = hashlib.blake2b(b"".join((*self.full, self.tools, self.template)), digest_size=16).digest()
        object.__setattr__(self, "prompt", prompt)
        object.__setattr__(self, "multimodal", any(m.media for m in self.messages))

    def extended(self, messages: list[Any], raw: RawJson) -> RequestKeys:
        """The keys of a request whose messages are `messages` (`raw`: their `RawJson`), its
        first ones those of this request (checked by the caller): only the rest are digested."""
        added = tuple(message_keys(m) for m in messages[len(self.messages) :])
        full = self.full + tuple(k.full for k in added)
        return RequestKeys(self.messages + added, self.tools, self.template, self.system_first, raw, full)


def raw_json(messages: list[Any], prefixes: Sequence[RawJson] = ()) -> tuple[RawJson, list[RawJson]]:
    """The `RawJson` of `messages`, and those of `prefixes` that are the JSON of its first
    messages; the JSON is read once, whatever the number of prefixes."""
    data = orjson.dumps(messages, option=orjson.OPT_SORT_KEYS)
    view = memoryview(data)
    hasher: Any = blake3.blake3() if blake3 is not None else hashlib.blake2b(digest_size=16)
    at, found = 0, []
    for prefix in sorted(prefixes, key=lambda p: p.length):
        cut = prefix.length - 1
        if cut >= len(data) - 1:
            break
        hasher.update(view[at:cut])
        at = cut
        if data[cut] == ord(",") and _digest16(hasher.copy()) == prefix.open:
            found.append(prefix)
    hasher.update(view[at : len(data) - 1])
    opened = _digest16(hasher.copy())
    hasher.update(view[len(data) - 1 :])
    return RawJson(_digest16(hasher), opened, len(data)), found


def _digest16(hasher: Any) -> Digest:
    return bytes(hasher.digest()[:16])


def context_keys(body: Mapping[str, Any]) -> tuple[Digest, Digest]:
    """The digests of a request's tools and of its template fields."""
    tools = digest(body.get("tools") or [])
    return tools, digest({k: body[k] for k in TEMPLATE_FIELDS if body.get(k) is not None})


def messages_of(body: Mapping[str, Any]) -> list[Any]:
    messages = body.get("messages")
    return messages if isinstance(messages, list) else []


def request_keys(body: Mapping[str, Any]) -> RequestKeys:
    """The digests of a chat request's messages, tools and template fields."""
    messages = messages_of(body)
    tools, template = context_keys(body)
    system_first = bool(messages) and isinstance(messages[0], Mapping) and messages[0].get("role") in SYSTEM_ROLES
    raw, _ = raw_json(messages)
    keys = tuple(message_keys(m) for m in messages)
    return RequestKeys(keys, tools, template, system_first, raw, tuple(k.full for k in keys))


def shared_prefix(a: Sequence[Digest], b: Sequence[Digest]) -> int:
    """How many leading digests `a` and `b` share."""
    n = min(len(a), len(b))
    if tuple(a[:n]) == tuple(b[:n]):
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i
