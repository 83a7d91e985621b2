"""What both translated APIs share: the `ClientApi` interface, the `send` wrapper, field checks."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import orjson
from starlette.types import Message, Send

from agl_store.bounds import MAX_JSON_DEPTH, check_json_depth
from agl_store.errors import InvalidInputError

from ..common.errors import BadRequestError
from ..recording.assembly import SSEParser
from ..recording.call_record import CallRecord


class StreamTranslator(ABC):
    """Turns one streamed chat answer into the events of a client API."""

    def __init__(self) -> None:
        self.failed = False

    @abstractmethod
    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        """The client's events for one chat chunk."""

    @abstractmethod
    def finish(self, response: dict[str, Any] | None) -> list[bytes]:
        """The closing events, given the assembled chat response (None if the backend sent none)."""

    @abstractmethod
    def fail(self, message: str, code: str) -> list[bytes]:
        """The events that end the stream on an error reported mid-stream."""


class ClientApi(ABC):
    """One client API served by chat completions."""

    name: str
    """The span's `agl.api` value."""
    refused: tuple[str, ...] = ()
    """Request fields that change what the model does and have no chat equivalent."""
    refused_why: str = "is not supported by agl's proxy"

    def chat_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat request for `body`; BadRequestError names the field that cannot be mapped."""
        check_depth(body)
        for name in self.refused:
            if body.get(name):
                raise refuse(name, self.refused_why)
        if body.get("model") is not None:
            expect(body["model"], str, "model", "a string")
        if body.get("stream") is not None:
            expect(body["stream"], bool, "stream", "a boolean")
        chat = self.chat_fields(body)
        if body.get("stream"):
            chat["stream"] = True
            # The closing event of each API carries the usage.
            chat["stream_options"] = {"include_usage": True}
        return chat

    def tools_left_out(self, request: dict[str, Any]) -> list[str]:
        """The types of the request's tools the model is not shown (tools the API's own servers run)."""
        return []

    @abstractmethod
    def chat_fields(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat request's fields but `stream`: model, messages, tools, sampling."""

    @abstractmethod
    def response(self, chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        """The API's response for a non-streamed chat response."""

    @abstractmethod
    def stream(self, request: dict[str, Any]) -> StreamTranslator:
        """A translator for one streamed answer to `request`."""

    @abstractmethod
    def error(self, status: int, error: dict[str, Any]) -> dict[str, Any]:
        """The API's error body for an OpenAI-shaped `error` object answered with `status`."""


TOOLS_LEFT_OUT_HEADER = b"x-agl-tools-left-out"
"""The answer's header naming (comma-separated) the types of the request's tools the model was not shown."""


class TranslatingSend:
    """An ASGI `send` that takes a chat answer (body, stream or error) and sends the API's.

    A backend or the endpoint answers through it exactly as for chat completions; `request`
    (the client's own body) and `record` are set by the endpoint once it has them.
    """

    __slots__ = ("_buffer", "_parser", "_start", "_stream", "api", "record", "request", "send", "tools_left_out")

    def __init__(self, send: Send, api: ClientApi) -> None:
        self.send = send
        self.api = api
        self.request: dict[str, Any] = {}
        self.record: CallRecord | None = None
        self.tools_left_out: list[str] = []
        """Named to the client in a `x-agl-tools-left-out` header."""
        self._start: Message | None = None
        self._buffer: list[bytes] = []
        self._stream: StreamTranslator | None = None
        self._parser: SSEParser | None = None

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            is_sse = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in message["headers"])
            if is_sse and message["status"] < 300:
                self._stream = self.api.stream(self.request)
                self._parser = SSEParser()
                await self.send(self._noted(message))
            else:
                self._start = message
            return
        if kind != "http.response.body":
            await self.send(message)
            return
        more = message.get("more_body", False)
        if self._stream is not None:
            await self._send_events(message.get("body", b""), more)
            return
        self._buffer.append(message.get("body", b""))
        if more:
            return
        start = self._start
        assert start is not None, "a body before its start"
        status = start["status"]
        try:
            parsed = orjson.loads(b"".join(self._buffer))
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            parsed = {"error": {"message": f"the backend answered HTTP {status} with a body that is not JSON"}}
        if status < 300:
            body = self.api.response(parsed, self.request)
        else:
            error = parsed.get("error")
            body = self.api.error(status, error if isinstance(error, dict) else {"message": str(error or parsed)})
        await self.send(self._noted(start))
        await self.send({"type": "http.response.body", "body": orjson.dumps(body)})

    def _noted(self, start: Message) -> Message:
        if not self.tools_left_out:
            return start
        note = (TOOLS_LEFT_OUT_HEADER, ",".join(self.tools_left_out).encode("latin-1", "replace"))
        return {**start, "headers": [*start["headers"], note]}

    async def _send_events(self, data: bytes, more: bool) -> None:
        stream, parser = self._stream, self._parser
        assert stream is not None and parser is not None
        out: list[bytes] = []
        for payload in parser.feed(data):
            if payload == b"[DONE]" or stream.failed:
                continue
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(chunk, dict):
                continue
            error = chunk.get("error")
            if error is not None:
                message = error.get("message") if isinstance(error, dict) else str(error)
                code = error.get("code") if isinstance(error, dict) else None
                out += stream.fail(str(message), str(code or "backend_error"))
            else:
                out += stream.feed(chunk)
        if not more and not stream.failed:
            out += stream.finish(self.record.response if self.record is not None else None)
        await self.send({"type": "http.response.body", "body": b"".join(out), "more_body": more})


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event with a JSON payload."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def deltas(chunk: dict[str, Any]) -> Iterator[tuple[str, Any, Any, Any, str]]:
    """The pieces of the first choice's delta in a chat chunk, in order.

    Each piece is (kind, tool index, tool call id, tool name, text): kind `reasoning` or
    `text` with their text, or `tool` with the arguments' part in `text`.
    """
    for choice in chunk.get("choices") or ():
        if choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or {}
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if reasoning:
            yield "reasoning", None, None, None, reasoning
        if delta.get("content"):
            yield "text", None, None, None, delta["content"]
        for call in delta.get("tool_calls") or ():
            function = call.get("function") or {}
            yield "tool", call.get("index", 0), call.get("id"), function.get("name"), function.get("arguments") or ""


def first_choice(chat: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(choice, message) of a chat response's first choice (empty when it has none)."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    return choice, choice.get("message") or {}


def cut_by_client(chat: dict[str, Any], limit: Any) -> bool:
    """Whether the answer ended for length at the client's own token `limit`.

    An answer cut short of it (by the proxy's cap, a deployment's default, the model's context)
    is, to the client, a turn that ended: the API says so, as an agent expects of a normal turn.
    The span keeps the chat answer's `finish_reason` (`length`) for the trainer.
    """
    choice, _ = first_choice(chat)
    if choice.get("finish_reason") != "length":
        return False
    output = (chat.get("usage") or {}).get("completion_tokens")
    if output is None:
        output = len(choice.get("token_ids") or ())
    return isinstance(limit, int) and not isinstance(limit, bool) and output >= limit


def reasoning_of(message: dict[str, Any]) -> str | None:
    """A chat message's reasoning (vLLM names it `reasoning`, older servers `reasoning_content`)."""
    return message.get("reasoning") or message.get("reasoning_content")


def base_id(chat: dict[str, Any]) -> str:
    """The chat response's id without vLLM's `chatcmpl-` prefix, for the API's own ids."""
    chat_id = str(chat.get("id") or "agl")
    return chat_id.removeprefix("chatcmpl-")


def json_arguments(arguments: str) -> dict[str, Any]:
    """Tool call arguments as an object; arguments that are not a JSON object become {}."""
    try:
        parsed = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


# vLLM's own request fields (sampling and template options) that no client API has: a client that
# knows it talks to vLLM sends them, and they pass through unchanged.
VLLM_FIELDS = {
    name: name
    for name in (
        "top_k",
        "min_p",
        "repetition_penalty",
        "seed",
        "min_tokens",
        "allowed_token_ids",
        "bad_words",
        "stop_token_ids",
        "ignore_eos",
        "chat_template_kwargs",
    )
}


# Checks on the client's fields: each failure is a 400 naming the field.


class TooDeepError(BadRequestError):
    """A body with a field nested deeper than the store keeps; `kept` is the body with each such
    field replaced by a note, which a span can hold."""

    def __init__(self, message: str, kept: dict[str, Any]) -> None:
        super().__init__(message)
        self.kept = kept


def check_depth(body: dict[str, Any]) -> None:
    """TooDeepError naming the field nested deeper than the store keeps (a span could not hold it,
    and an answer echoing it could not be written)."""
    too_deep = [name for name, value in body.items() if not _storable(value)]
    if too_deep:
        note = f"<nests deeper than {MAX_JSON_DEPTH} levels: not kept>"
        kept = {name: note if name in too_deep else value for name, value in body.items()}
        raise TooDeepError(f"{str(too_deep[0])[:100]}: nests deeper than {MAX_JSON_DEPTH} levels", kept)


def _storable(value: Any) -> bool:
    try:
        check_json_depth(value, "")
    except InvalidInputError:
        return False
    return True


def refuse(field: str, why: str) -> BadRequestError:
    return BadRequestError(f"{field}: {why}")


def expect(value: Any, kind: type | tuple[type, ...], field: str, what: str) -> Any:
    """`value` when it is a `kind`, else BadRequestError naming `field` (`what`: the kind in words)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise refuse(field, f"must be {what}, got {type(value).__name__}")
    return value


# The kinds of the fields both APIs pass on as they are: a wrong one is the client's 400, not the backend's.
_NUMBER = ((int, float), "a number")
_FIELD_KINDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "max_tokens": (int, "an integer"),
    "max_output_tokens": (int, "an integer"),
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "top_k": (int, "an integer"),
    "min_p": _NUMBER,
    "repetition_penalty": _NUMBER,
    "seed": (int, "an integer"),
    "min_tokens": (int, "an integer"),
    "parallel_tool_calls": (bool, "a boolean"),
    "ignore_eos": (bool, "a boolean"),
    "allowed_token_ids": (list, "a list of token ids"),
    "bad_words": (list, "a list of strings"),
    "stop_token_ids": (list, "a list of token ids"),
    "chat_template_kwargs": (dict, "an object"),
}


def copy_fields(body: dict[str, Any], out: dict[str, Any], names: dict[str, str]) -> None:
    """Copy the request fields present in `body` to `out` under their chat names, checking their kinds."""
    for name, chat_name in names.items():
        value = body.get(name)
        if value is not None:
            kind = _FIELD_KINDS.get(name)
            out[chat_name] = value if kind is None else expect(value, kind[0], name, kind[1])
