"""Tool-call ids as vLLM's chat endpoint gives them.

The derender gives every parsed call a random id of its own (`vllm/renderers/online_derenderer.py`),
where the chat endpoint keeps the one its tool parser made and draws the rest with
`make_tool_call_id` (`vllm/entrypoints/chat_utils.py`): `chatcmpl-tool-` and 16 hex digits by
default (hermes and most parsers), `functions.NAME:INDEX` numbered on from the calls already in
the conversation for Kimi-K2's models, 9 letters and digits for Mistral's parser (its template
refuses other ids). The streamed derender's parsers make them as the chat endpoint's do; a
deployment names its parser's style (`model_info.agl_tool_call_ids`), since no endpoint shows it.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Mapping
from typing import Any

_MISTRAL_ALPHABET = string.ascii_letters + string.digits


def tool_call_id(style: str, name: str, index: int) -> str:
    """The id vLLM makes for a call to `name`, the conversation's `index`-th (counted from 0), in `style`
    (`Deployment.tool_call_ids`: `random`, `kimi_k2` or `mistral`)."""
    if style == "kimi_k2":
        return f"functions.{name}:{index}"
    if style == "mistral":
        return "".join(secrets.choice(_MISTRAL_ALPHABET) for _ in range(9))
    return f"chatcmpl-tool-{secrets.token_hex(8)}"


def calls_before(messages: Any) -> int:
    """The tool calls of the conversation's assistant messages (Kimi-K2's ids number on from them)."""
    if not isinstance(messages, list):
        return 0
    return sum(
        len(m.get("tool_calls") or ())
        for m in messages
        if isinstance(m, Mapping) and m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list)
    )


def name_tool_calls(response: Mapping[str, Any], request: Mapping[str, Any], style: str) -> None:
    """Give the tool calls of a derendered answer to `request` the ids the chat endpoint would."""
    first = calls_before(request.get("messages"))
    for choice in response.get("choices") or ():
        calls = (choice.get("message") or {}).get("tool_calls") or ()
        for at, call in enumerate(calls):
            call["id"] = tool_call_id(style, (call.get("function") or {}).get("name") or "", first + at)
