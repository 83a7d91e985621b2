"""OpenAI's Responses API (`/v1/responses`) over chat completions, stateless.

docs/proxy.md lists what maps to what; in short: `instructions` is the first system message
(`developer` messages are system messages too); `input` items are chat messages, an assistant
`message` and the call items after it (`function_call`, `custom_tool_call`, `local_shell_call`)
one assistant message with `tool_calls`, their output items `tool` messages, and a `reasoning`
item the next assistant message's `reasoning`; tools map as `responses_tools` says. The proxy
keeps no responses, so `previous_response_id`, `conversation`
and `background` are refused: a client sends its whole history (`store: false`).
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
    reasoning_of,
    refuse,
    sse,
)
from .responses_tools import LOCAL_SHELL, ToolMap, custom_arguments, tool_map

_SAMPLING = {
    "max_output_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "parallel_tool_calls": "parallel_tool_calls",
    **VLLM_FIELDS,
}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _part(part: Any, field: str) -> dict[str, Any]:
    part = expect(part, dict, field, "a content part")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "refusal"):
        key = "refusal" if kind == "refusal" else "text"
        return {"type": "text", "text": expect(part.get(key), str, f"{field}.{key}", "a string")}
    if kind == "input_image":
        url = expect(part.get("image_url"), str, field + ".image_url", "a URL (file ids are not supported)")
        image = {"url": url}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise refuse(field + ".type", f"{kind!r:.50} parts are not supported")


def _content(content: Any, field: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts = [_part(part, f"{field}[{j}]") for j, part in enumerate(expect(content, list, field, "a string or a list"))]
    return parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _text_output(output: Any, field: str) -> str:
    content = _content(output, field)
    if isinstance(content, str):
        return content
    if any(part["type"] != "text" for part in content):
        raise refuse(field, "a function call's output must be text")
    return "".join(part["text"] for part in content)


_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")
_HOSTED_CALLS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "computer_call",
        "computer_call_output",
        "mcp_call",
        "mcp_list_tools",
        "tool_search_call",
        "tool_search_output",
    }
)
"""History items of hosted tools: the model is not shown those tools, so not their calls either."""


def _history_call(item: dict[str, Any], field: str, tools: ToolMap) -> dict[str, Any]:
    """The chat tool call of a `function_call`, `custom_tool_call` or `local_shell_call` item."""
    kind = item["type"]
    namespace = item.get("namespace")
    if namespace is not None:
        expect(namespace, str, field + ".namespace", "a string")
    if kind == "local_shell_call":
        call_id = item.get("call_id") or item.get("id")
        action = expect(item.get("action"), dict, field + ".action", "an object")
        name, arguments = tools.function_name(LOCAL_SHELL), json.dumps({k: v for k, v in action.items() if k != "type"})
    else:
        call_id = item.get("call_id")
        name = tools.function_name(expect(item.get("name"), str, field + ".name", "a string"), namespace)
        if kind == "custom_tool_call":
            arguments = custom_arguments(expect(item.get("input"), str, field + ".input", "a string"))
        else:
            arguments = expect(item.get("arguments"), str, field + ".arguments", "a string")
    call_id = expect(call_id, str, field + ".call_id", "a string")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_messages(body: dict[str, Any], tools: ToolMap | None = None) -> list[dict[str, Any]]:
    """The chat messages of a Responses request: its instructions and input (`tools`: its tools' map)."""
    tools = tools if tools is not None else tool_map(body.get("tools"))
    out: list[dict[str, Any]] = []
    if body.get("instructions") is not None:
        out.append({"role": "system", "content": expect(body["instructions"], str, "instructions", "a string")})
    items = body.get("input")
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        return out
    # The assistant message the next call items join (one chat turn), and reasoning waiting for it.
    turn: dict[str, Any] | None = None
    reasoning: str | None = None
    for i, item in enumerate(expect(items, list, "input", "a string or a list of items")):
        field = f"input[{i}]"
        item = expect(item, dict, field, "an object")
        kind = expect(item.get("type", "message"), str, field + ".type", "a string")
        if kind == "message":
            given = item.get("role")
            role = _ROLES.get(given) if isinstance(given, str) else None
            if role is None:
                raise refuse(field + ".role", f"must be user, assistant, system or developer, got {given!r:.50}")
            message: dict[str, Any] = {"role": role, "content": _content(item.get("content"), field + ".content")}
            turn = None
            if role == "assistant":
                turn = message
                if reasoning is not None:
                    message["reasoning"], reasoning = reasoning, None
            out.append(message)
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            call = _history_call(item, field, tools)
            if turn is None:
                turn = {"role": "assistant", "content": None}
                if reasoning is not None:
                    turn["reasoning"], reasoning = reasoning, None
                out.append(turn)
            turn.setdefault("tool_calls", []).append(call)
        elif kind in _OUTPUTS:
            call_id = item.get("call_id") or (item.get("id") if kind == "local_shell_call_output" else None)
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": expect(call_id, str, field + ".call_id", "a string"),
                    "content": _text_output(item.get("output"), field + ".output"),
                }
            )
            turn = None
        elif kind == "reasoning":
            key = "content" if item.get("content") else "summary"
            texts = expect(item.get(key) or [], list, f"{field}.{key}", "a list")
            reasoning = "".join(str(t.get("text", "")) for t in texts if isinstance(t, dict))
            turn = None
        elif kind not in _HOSTED_CALLS:
            raise refuse(field + ".type", f"{kind!r:.50} items are not supported")
    return out


def _tool_choice(choice: Any, tools: ToolMap) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    choice = expect(choice, (dict, str), "tool_choice", "auto, none, required or a function")
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        name = expect(choice.get("name"), str, "tool_choice.name", "a string")
        return {"type": "function", "function": {"name": tools.function_name(name, choice.get("namespace"))}}
    if isinstance(choice, dict) and choice.get("type") == LOCAL_SHELL:
        return {"type": "function", "function": {"name": tools.function_name(LOCAL_SHELL)}}
    raise refuse("tool_choice", f"must be auto, none, required, a function or a custom tool, got {choice!r:.80}")


def _text_format(text: Any) -> dict[str, Any] | None:
    fmt = expect(text, dict, "text", "an object").get("format")
    if fmt is None:
        return None
    fmt = expect(fmt, dict, "text.format", "an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise refuse("text.format.type", f"must be text, json_object or json_schema, got {kind!r:.50}")


class ResponsesApi(ClientApi):
    name = "responses"
    refused = ("previous_response_id", "conversation", "background", "prompt")
    refused_why = "is not supported: agl's proxy keeps no state; send the whole conversation in input"

    def chat_fields(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = tool_map(body.get("tools"))
        chat: dict[str, Any] = {"model": body.get("model"), "messages": chat_messages(body, tools)}
        copy_fields(body, chat, _SAMPLING)
        if body.get("tool_choice") is not None:
            choice = _tool_choice(body["tool_choice"], tools)
            if tools.functions:  # else every tool was a hosted one: there is nothing to choose
                chat["tool_choice"] = choice
        if tools.functions:
            chat["tools"] = tools.functions
        if body.get("text") is not None and (fmt := _text_format(body["text"])) is not None:
            chat["response_format"] = fmt
        reasoning = body.get("reasoning")
        effort = expect(reasoning, dict, "reasoning", "an object").get("effort") if reasoning is not None else None
        if effort is not None:
            chat["reasoning_effort"] = effort
        if body.get("top_logprobs"):
            chat["logprobs"] = True
            chat["top_logprobs"] = expect(body["top_logprobs"], int, "top_logprobs", "an integer")
        return chat

    def response(self, chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        choice, message = first_choice(chat)
        base = base_id(chat)
        output: list[dict[str, Any]] = []
        reasoning = reasoning_of(message)
        if reasoning:
            output.append(_reasoning_item(base, reasoning))
        if message.get("content"):
            output.append(_message_item(base, message["content"]))
        tools = tool_map(request.get("tools"))
        for i, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") or {}
            arguments = function.get("arguments") or ""
            output.append(tools.output_item(base, i, call.get("id"), function.get("name"), arguments))
        return _response(chat, request, output, choice.get("finish_reason"))

    def tools_left_out(self, request: dict[str, Any]) -> list[str]:
        return tool_map(request.get("tools")).left_out

    def stream(self, request: dict[str, Any]) -> StreamTranslator:
        return ResponsesStream(request)

    def error(self, status: int, error: dict[str, Any]) -> dict[str, Any]:
        return {"error": error}  # the Responses API's errors are OpenAI's


def _reasoning_item(base: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"type": "reasoning", "id": "rs_" + base, "summary": [], "content": content, "status": status}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(base: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"type": "message", "id": "msg_" + base, "status": status, "role": "assistant", "content": content}


def _response(
    chat: dict[str, Any], request: dict[str, Any], output: list[dict[str, Any]], finish_reason: str | None
) -> dict[str, Any]:
    """The response object; `finish_reason` None while the response is in progress.

    `incomplete` only when the client's own `max_output_tokens` ended it (`cut_by_client`).
    """
    usage = chat.get("usage") or {}
    status = "in_progress" if finish_reason is None else "completed"
    if finish_reason == "length" and cut_by_client(chat, request.get("max_output_tokens")):
        status = "incomplete"
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "id": "resp_" + base_id(chat),
        "object": "response",
        "created_at": chat.get("created"),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": chat.get("model"),
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": request.get("reasoning"),
        "store": False,
        "temperature": request.get("temperature"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "metadata": request.get("metadata") or {},
        "usage": None
        if not usage
        else {
            "input_tokens": usage.get("prompt_tokens", 0),
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": usage.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.get("total_tokens", 0),
        },
    }


class ResponsesStream(StreamTranslator):
    """response.created, then per output item its added / delta / done events, then response.completed."""

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__()
        self._request = request
        self._tools = tool_map(request.get("tools"))
        self._sequence = 0
        self._base = ""
        self._started = False
        self._index = -1
        self._open: tuple[str, Any] | None = None
        self._item: dict[str, Any] = {}
        self._name: Any = None
        """The model's name for the open tool call's function."""
        self._text: list[str] = []

    def _event(self, kind: str, **data: Any) -> bytes:
        event = {"type": kind, **data, "sequence_number": self._sequence}
        self._sequence += 1
        return sse(kind, event)

    def _start(self, chunk: dict[str, Any]) -> list[bytes]:
        self._started = True
        self._base = base_id(chunk)
        response = _response({**chunk, "usage": None}, self._request, [], None)
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        kind, item, index = self._open[0], self._item, self._index
        text = "".join(self._text)
        out = []
        if kind == "text":
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self._event("response.output_text.done", **ids, text=text, logprobs=[]))
            out.append(self._event("response.content_part.done", **ids, part=_text_part(text)))
            item = _message_item(self._base, text)
        elif kind == "reasoning":
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self._event("response.reasoning_text.done", **ids, text=text))
            item = _reasoning_item(self._base, text)
        elif item["type"] == "function_call":
            ids = {"item_id": item["id"], "output_index": index}
            out.append(self._event("response.function_call_arguments.done", **ids, name=item["name"], arguments=text))
            item = {**item, "arguments": text, "status": "completed"}
        else:
            # Custom and local shell calls are whole only once their function's arguments are.
            item = {
                **self._tools.output_item(self._base, self._open[1], item["call_id"], self._name, text),
                "id": item["id"],
            }
            if item["type"] == "custom_tool_call":
                ids = {"item_id": item["id"], "output_index": index}
                out.append(self._event("response.custom_tool_call_input.done", **ids, input=item["input"]))
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        self._open = None
        return out

    def _open_item(self, key: tuple[str, Any], item: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self._index += 1
        self._open, self._item, self._text = key, item, []
        out.append(self._event("response.output_item.added", output_index=self._index, item=item))
        if key[0] == "text":
            ids = {"item_id": item["id"], "output_index": self._index, "content_index": 0}
            out.append(self._event("response.content_part.added", **ids, part=_text_part("")))
        return out

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        out = [] if self._started else self._start(chunk)
        for kind, index, call_id, name, text in deltas(chunk):
            key = (kind, index)
            if self._open != key:
                if kind == "text":
                    item = _message_item(self._base, None, "in_progress")
                elif kind == "reasoning":
                    item = _reasoning_item(self._base, "", "in_progress")
                else:
                    item = {**self._tools.output_item(self._base, index, call_id, name, ""), "status": "in_progress"}
                out += self._open_item(key, item)  # closes the open item first
                self._name = name
            if not text:
                continue
            self._text.append(text)
            ids = {"item_id": self._item["id"], "output_index": self._index}
            if kind == "text":
                out.append(self._event("response.output_text.delta", **ids, content_index=0, delta=text, logprobs=[]))
            elif kind == "reasoning":
                out.append(self._event("response.reasoning_text.delta", **ids, content_index=0, delta=text))
            elif self._item["type"] == "function_call":
                out.append(self._event("response.function_call_arguments.delta", **ids, delta=text))
        return out

    def finish(self, response: dict[str, Any] | None) -> list[bytes]:
        response = response or {}
        out = [] if self._started else self._start(response)
        out += self._close()
        final = RESPONSES.response(response, self._request)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*out, self._event(kind, response=final)]

    def fail(self, message: str, code: str) -> list[bytes]:
        self.failed = True
        return [self._event("error", code=code, message=message, param=None)]


RESPONSES = ResponsesApi()
