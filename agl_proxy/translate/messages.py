"""Anthropic's Messages API (`/v1/messages`) over chat completions.

docs/proxy.md lists what maps to what; in short: `system` (a string or text blocks, joined by a
blank line) is the first system message; text and image blocks are content parts (a lone text block
is a string; `document` and `search_result` blocks are text too); `tool_use` blocks are the
assistant's `tool_calls`, `tool_result` blocks `tool` messages; `thinking` blocks are the assistant
message's `reasoning` (what vLLM hands the chat template), `redacted_thinking` blocks are dropped
(their text is encrypted), and so are the blocks of server tools (`server_tool_use`,
`web_search_tool_result`, ...): tools map as `messages_tools` says.
"""

from __future__ import annotations

import json
from typing import Any

from .base import (
    VLLM_FIELDS,
    ClientApi,
    StreamTranslator,
    base_id,
    copy_fields,
    cut_by_client,
    deltas,
    expect,
    first_choice,
    json_arguments,
    reasoning_of,
    refuse,
    sse,
)
from .messages_tools import block_text, chat_tools, is_server_block

_SAMPLING = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", **VLLM_FIELDS}
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _image_url(block: dict[str, Any], field: str) -> dict[str, Any]:
    source = expect(block.get("source"), dict, field + ".source", "an object")
    kind = source.get("type")
    if kind == "base64":
        url = f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"
    elif kind == "url":
        url = expect(source.get("url"), str, field + ".source.url", "a string")
    else:
        raise refuse(field + ".source.type", f"must be base64 or url, got {kind!r:.50}")
    return {"type": "image_url", "image_url": {"url": url}}


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    return parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _text(value: Any, field: str) -> str:
    """A string, or the texts of a list of text blocks joined by a blank line."""
    if isinstance(value, str):
        return value
    texts = []
    for j, block in enumerate(expect(value, list, field, "a string or a list of text blocks")):
        block = expect(block, dict, f"{field}[{j}]", "a text block")
        if block.get("type") != "text":
            raise refuse(f"{field}[{j}].type", f"must be text, got {block.get('type')!r:.50}")
        texts.append(expect(block.get("text"), str, f"{field}[{j}].text", "a string"))
    return "\n\n".join(texts)


def _tool_result(block: dict[str, Any], field: str, out: list[dict[str, Any]]) -> None:
    call_id = expect(block.get("tool_use_id"), str, field + ".tool_use_id", "a string")
    content = block.get("content", "")
    images = []
    if isinstance(content, list):
        texts = []
        for k, item in enumerate(content):
            where = f"{field}.content[{k}]"
            item = expect(item, dict, where, "a block")
            text = block_text(item, where)
            if text is not None:
                texts.append(text)
            elif item.get("type") == "image":
                images.append(_image_url(item, where))
            else:
                raise refuse(
                    where + ".type", f"must be text, image, document or search_result, got {item.get('type')!r:.50}"
                )
        content = "\n".join(texts)
    out.append({"role": "tool", "tool_call_id": call_id, "content": expect(content, str, field + ".content", "text")})
    if images:
        # A chat template takes no images in a tool message: they follow it as the user's.
        out.append({"role": "user", "content": images})


def _message(message: Any, i: int, out: list[dict[str, Any]]) -> None:
    field = f"messages[{i}]"
    message = expect(message, dict, field, "an object")
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise refuse(field + ".role", f"must be user or assistant, got {role!r:.50}")
    content = message.get("content")
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    if role == "system":
        out.append({"role": "system", "content": _text(content, field + ".content")})
        return
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(expect(content, list, field + ".content", "a string or a list of blocks")):
        where = f"{field}.content[{j}]"
        block = expect(block, dict, where, "a block")
        kind = block.get("type")
        text = block_text(block, where)
        if text is not None:
            parts.append({"type": "text", "text": text})
        elif is_server_block(kind):
            continue  # a server tool's use or result: the model is not shown server tools
        elif kind == "image":
            parts.append(_image_url(block, where))
        elif kind == "tool_use" and role == "assistant":
            arguments = json.dumps(block.get("input") or {})  # spaced as OpenAI clients send them
            name = expect(block.get("name"), str, where + ".name", "a string")
            call_id = expect(block.get("id"), str, where + ".id", "a string")
            tool_calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        elif kind == "tool_result" and role == "user":
            if parts:  # text before a result stays before it
                out.append({"role": "user", "content": _content(parts)})
                parts = []
            _tool_result(block, where, out)
        elif kind == "thinking" and role == "assistant":
            reasoning.append(expect(block.get("thinking"), str, where + ".thinking", "a string"))
        elif kind == "redacted_thinking" and role == "assistant":
            continue
        else:
            raise refuse(where + ".type", f"{kind!r:.50} blocks are not supported in {role} messages")
    if role == "user":
        if parts:
            out.append({"role": "user", "content": _content(parts)})
        return
    chat: dict[str, Any] = {"role": "assistant", "content": _content(parts) if parts else None}
    if tool_calls:
        chat["tool_calls"] = tool_calls
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    out.append(chat)


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    choice = expect(choice, dict, "tool_choice", "an object")
    kind = choice.get("type")
    if kind == "tool":
        name = expect(choice.get("name"), str, "tool_choice.name", "a string")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif kind in ("auto", "any", "none"):
        chat["tool_choice"] = "required" if kind == "any" else kind
    else:
        raise refuse("tool_choice.type", f"must be auto, any, tool or none, got {kind!r:.50}")
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Messages (or count_tokens) request."""
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        out.append({"role": "system", "content": _text(body["system"], "system")})
    for i, message in enumerate(expect(body.get("messages"), list, "messages", "a list")):
        _message(message, i, out)
    return out


def _stop_reason(chat: dict[str, Any], request: dict[str, Any]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a chat answer; vLLM names the stop string that ended it in `stop_reason`.

    `max_tokens` only when the client's own `max_tokens` ended it (`cut_by_client`), else `end_turn`.
    """
    choice, _ = first_choice(chat)
    finish = choice.get("finish_reason")
    if finish == "length" and not cut_by_client(chat, request.get("max_tokens")):
        return "end_turn", None
    if finish == "stop" and isinstance(choice.get("stop_reason"), str):
        return "stop_sequence", choice["stop_reason"]
    return _STOP_REASONS.get(finish or "", "end_turn"), None


def _usage(chat: dict[str, Any], choice: dict[str, Any]) -> dict[str, int]:
    usage = chat.get("usage") or {}
    prompt = usage.get("prompt_tokens")
    if prompt is None:
        prompt = len(chat.get("prompt_token_ids") or ())
    output = usage.get("completion_tokens")
    if output is None:
        output = len(choice.get("token_ids") or ())
    return {"input_tokens": prompt, "output_tokens": output}


class MessagesApi(ClientApi):
    name = "messages"
    refused = ("mcp_servers", "container")

    def chat_fields(self, body: dict[str, Any]) -> dict[str, Any]:
        chat: dict[str, Any] = {"model": body.get("model"), "messages": chat_messages(body)}
        if body.get("max_tokens") is None:
            raise refuse("max_tokens", "is required")
        copy_fields(body, chat, _SAMPLING)
        if body.get("stop_sequences") is not None:
            chat["stop"] = expect(body["stop_sequences"], list, "stop_sequences", "a list of strings")
        tools = chat_tools(body.get("tools"))
        if body.get("tool_choice") is not None:
            _tool_choice(body["tool_choice"], chat)
        if tools.functions:
            chat["tools"] = tools.functions
        else:  # every tool was a server tool: there is nothing to choose
            chat.pop("tool_choice", None)
        return chat

    def tools_left_out(self, request: dict[str, Any]) -> list[str]:
        return chat_tools(request.get("tools")).left_out

    def response(self, chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        choice, message = first_choice(chat)
        content: list[dict[str, Any]] = []
        reasoning = reasoning_of(message)
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            arguments = json_arguments(function.get("arguments") or "")
            content.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": arguments})
        stop_reason, stop_sequence = _stop_reason(chat, request)
        return {
            "id": "msg_" + base_id(chat),
            "type": "message",
            "role": "assistant",
            "model": chat.get("model"),
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": _usage(chat, choice),
        }

    def stream(self, request: dict[str, Any]) -> StreamTranslator:
        return MessagesStream(request)

    def error(self, status: int, error: dict[str, Any]) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": str(error.get("message", ""))}}


class MessagesStream(StreamTranslator):
    """message_start, ping, then one content block per run of text, thinking or one tool call."""

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__()
        self._request = request
        self._started = False
        self._index = -1
        self._open: tuple[str, Any] | None = None

    def _start(self, chunk: dict[str, Any]) -> list[bytes]:
        self._started = True
        message: dict[str, Any] = {
            "id": "msg_" + base_id(chunk),
            "type": "message",
            "role": "assistant",
            "model": chunk.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": len(chunk.get("prompt_token_ids") or ()), "output_tokens": 0},
        }
        return [
            sse("message_start", {"type": "message_start", "message": message}),
            sse("ping", {"type": "ping"}),
        ]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [sse("content_block_stop", {"type": "content_block_stop", "index": self._index})]

    def _block(self, key: tuple[str, Any], block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self._index += 1
        self._open = key
        event = {"type": "content_block_start", "index": self._index, "content_block": block}
        return [*out, sse("content_block_start", event)]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        out = [] if self._started else self._start(chunk)
        for kind, index, call_id, name, text in deltas(chunk):
            if kind == "tool":
                if self._open != ("tool", index):
                    block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
                    out += self._block(("tool", index), block)
                if text:
                    out.append(self._delta({"type": "input_json_delta", "partial_json": text}))
            elif kind == "text":
                if self._open != ("text", None):
                    out += self._block(("text", None), {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": text}))
            else:
                if self._open != ("thinking", None):
                    out += self._block(("thinking", None), {"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": text}))
        return out

    def finish(self, response: dict[str, Any] | None) -> list[bytes]:
        response = response or {}
        out = [] if self._started else self._start(response)
        out += self._close()
        choice, _ = first_choice(response)
        stop_reason, stop_sequence = _stop_reason(response, self._request)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"output_tokens": _usage(response, choice)["output_tokens"]},
        }
        return [*out, sse("message_delta", delta), sse("message_stop", {"type": "message_stop"})]

    def fail(self, message: str, code: str) -> list[bytes]:
        self.failed = True
        return [sse("error", {"type": "error", "error": {"type": "api_error", "message": message}})]


MESSAGES = MessagesApi()
