"""What a bridge proves before it joins a call's prompt from kept ids: where the new messages
start in the engine's renderings, and that the chat template only appends to the history.

A bridge renders one small request (the system message, a dummy user turn, the echoed answer,
the new messages; `bridge_requests`) instead of the whole conversation. Its prompt (the parent's
prompt ids, the answer's sampled ids, the turn close, then the new messages as the small request
renders them) is the template's own only where the template renders the history the same once
the new messages follow. Some templates do not: Mistral v0.3's puts the tools and the system
prompt before the last user message (and the system prompt only where that message is the last),
Qwen3's drops the reasoning of the answers before the last user message. `keeps_head` and
`reasoning_requests` are the checks; where they fail, the call's prompt is the template's rendering
of the whole request, rebuilt from the model's own ids where the template writes the same text
(`rebuild`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from .digests import REASONING_KEYS, SYSTEM_ROLES, reasoning_of

_DUMMY_USER = {"role": "user", "content": "."}
_MAX_HEADER = 32
"""The most ids an assistant turn's header (role, channel, think opener) is looked for in."""


def _head_messages(messages: Sequence[Any]) -> list[Any]:
    first = messages[0]
    system = [first] if isinstance(first, Mapping) and first.get("role") in SYSTEM_ROLES else []
    return [*system, _DUMMY_USER]


def bridge_requests(body: Mapping[str, Any], new_from: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two small requests whose renderings differ by exactly what follows the echoed answer:
    (system, a dummy user turn, the echoed answer, the new messages; with the request's own
    generation prompt) and the same without the new messages or a generation prompt (whose
    messages but the last are the head `heads` keeps)."""
    messages = body["messages"]
    head = [*_head_messages(messages), messages[new_from - 1]]
    full = {**body, "messages": head + list(messages[new_from:])}
    base = {**body, "messages": head, "add_generation_prompt": False, "continue_final_message": False}
    return full, base


def keeps_head(rendered: Sequence[int], head: Sequence[int]) -> bool:
    """Whether a rendering of the head and more starts with the head rendered alone: the template
    rendered what comes before the echoed answer the same whatever follows it. Where it does not
    (it moved the tools or the system prompt to the last user message), the kept prompt ids are not
    what the template makes of the history, and the call is rendered whole."""
    return len(rendered) > len(head) and list(rendered[: len(head)]) == list(head)


def echoed_answer_end(
    full_ids: list[int], head: Sequence[int], parent_prompt: Any, response_ids: Any, close: tuple[int, ...]
) -> int | None:
    """Where the echoed answer's turn ends in `full_ids` (the head, the echoed answer, the new
    messages) when the engine rendered that answer as the very ids it was sampled as; None otherwise.

    `full_ids` must start with `head` (the system message and the dummy user turn rendered alone).
    The answer's turn is then the ids its prompt ended with (the assistant header, as generate was
    given it), the sampled ids without their stop id, and `close`, found at the first place past the
    head where the sampled ids and the close are; anything else (a template that renders the answer
    otherwise, as Qwen3 drops an earlier turn's reasoning, or tool calls written differently) is
    None, and the bridge renders the echoed answer alone to see where it ends."""
    n = len(head)
    if len(full_ids) <= n or full_ids[:n] != list(head):
        return None
    answer = list(response_ids[:-1] if len(response_ids) and response_ids[-1] == close[0] else response_ids)
    if not answer:
        return None
    turn = [*answer, *close]
    first = answer[0]
    for at in range(n + 1, min(n + 1 + _MAX_HEADER, len(full_ids) - len(turn) + 1)):
        if full_ids[at] == first and full_ids[at : at + len(turn)] == turn:
            header = full_ids[n:at]
            if list(parent_prompt[-len(header) :]) == header:
                return at + len(turn)
            return None
    return None


def turn_glue(response_ids: Any, close: tuple[int, ...]) -> list[int]:
    """What follows a sampled answer before the next turn: the template's close, without its
    first id when the model sampled that itself (a cut or otherwise stopped answer gets it all)."""
    if len(response_ids) and response_ids[-1] == close[0]:
        return list(close[1:])
    return list(close)


def new_messages_start(
    full_ids: list[int], base_ids: list[int], close: tuple[int, ...], close_text: str, echoed: Any
) -> int | None:
    """Where the new messages start in `full_ids` (the echoed answer then the new messages),
    `base_ids` being the echoed answer alone; None when the renderings do not show it. Both must
    keep the head (`keeps_head`): that is the caller's check.

    Where the base is a prefix, they start after it. A template may render its last answer
    otherwise (Qwen3 gives the last one an empty think block): then the echoed answer's turn ends
    at the first `close` past what the renderings share, provided the answer's own text holds no
    `close_text` (which would be that close instead)."""
    if not close or tuple(base_ids[-len(close) :]) != close:
        return None
    if len(full_ids) > len(base_ids) and full_ids[: len(base_ids)] == base_ids:
        return len(base_ids)
    if not close_text or close_text in orjson.dumps(echoed).decode():
        return None
    shared = 0
    while shared < min(len(full_ids), len(base_ids)) and full_ids[shared] == base_ids[shared]:
        shared += 1
    width = len(close)
    for at in range(shared, len(full_ids) - width):
        if tuple(full_ids[at : at + width]) == close:
            return at + width
    return None


def _without_reasoning(message: Any) -> Any:
    if not isinstance(message, Mapping) or message.get("role") != "assistant":
        return message
    return {k: v for k, v in message.items() if k not in REASONING_KEYS}


def _answers_since_last_user(messages: list[Any], end: int) -> list[Any]:
    """The messages before `end` since the last user message, without system ones."""
    since = end
    while since > 0 and not (isinstance(messages[since - 1], Mapping) and messages[since - 1].get("role") == "user"):
        since -= 1
    return [m for m in messages[since:end] if not (isinstance(m, Mapping) and m.get("role") in SYSTEM_ROLES)]


def _with_reasoning(messages: list[Any]) -> bool:
    return any(isinstance(m, Mapping) and m.get("role") == "assistant" and reasoning_of(m) for m in messages)


def reasoning_requests(body: Mapping[str, Any], new_from: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Two small requests that differ only by the reasoning of the answers since the last user
    message before the echoed answer (the echoed one included), as the client sent them: their
    renderings are equal where the template drops that reasoning once the new messages follow
    (Qwen3 at a new user turn). None when none of those answers carries reasoning."""
    messages = body["messages"]
    turn = _answers_since_last_user(messages, new_from)
    if not _with_reasoning(turn):
        return None
    head, new = _head_messages(messages), list(messages[new_from:])
    kept = {**body, "messages": [*head, *turn, *new], "add_generation_prompt": False, "continue_final_message": False}
    return kept, {**kept, "messages": [*head, *(_without_reasoning(m) for m in turn), *new]}


def parent_reasoning_requests(body: Mapping[str, Any], new_from: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Two small requests for the parent's prompt (the messages before the echoed answer, then the
    generation prompt) that differ only by the reasoning of its answers since the last user message:
    their renderings are equal where the parent's prompt did not show that reasoning (Qwen2.5's
    template never does), so the bridge, which keeps the parent's ids, keeps none of it either.
    None when none of those answers carries reasoning."""
    messages = body["messages"]
    turn = _answers_since_last_user(messages, new_from - 1)
    if not _with_reasoning(turn):
        return None
    head = _head_messages(messages)
    kept = {**body, "messages": [*head, *turn], "add_generation_prompt": True, "continue_final_message": False}
    return kept, {**kept, "messages": [*head, *(_without_reasoning(m) for m in turn)]}
