"""Rebuilding a streamed response as the equivalent non-streamed one.

The client receives the backend's SSE bytes untouched; this module reads the same bytes on
the side so that the span holds one complete response (text, tool calls, token ids,
logprobs) in the non-stream shape, whatever the backend streamed.
"""

from __future__ import annotations

from typing import Any

import orjson

_TOP_LEVEL_KEYS = (
    "id",
    "created",
    "model",
    "system_fingerprint",
    "prompt_token_ids",
    "prompt_logprobs",
    "kv_transfer_params",
)


class SSEParser:
    """Splits a byte stream into the payloads of its `data:` lines."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The complete `data:` payloads in `data` (plus what was left over before)."""
        buf = self._pending + data
        lines = buf.split(b"\n")
        self._pending = lines.pop()
        payloads = []
        for line in lines:
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                payloads.append(line[5:].strip())
        return payloads


class StreamAssembler:
    """Accumulates chat or completion chunks into one response dict.

    `operation` is `chat` or `text_completion`. Feed raw SSE bytes with `feed`; read the
    assembled response from `result()`. A chunk that is not JSON is kept in `garbage`.
    """

    def __init__(self, operation: str) -> None:
        self.chat = operation == "chat"
        self._parser = SSEParser()
        self._top: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] | None = None
        self.error: Any | None = None
        self.garbage: bytes | None = None
        self.done = False
        self.chunks = 0
        self.first_token_seen = False

    def feed(self, data: bytes) -> None:
        for payload in self._parser.feed(data):
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                self.garbage = self.garbage or payload[:200]
                continue
            if isinstance(chunk, dict):
                self._add(chunk)

    def _add(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        if "error" in chunk:
            self.error = chunk["error"]
            return
        for key in _TOP_LEVEL_KEYS:
            if key not in self._top and chunk.get(key) is not None:
                self._top[key] = chunk[key]
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for delta_choice in chunk.get("choices") or ():
            index = delta_choice.get("index", 0)
            choice = self._choices.get(index)
            if choice is None:
                choice = self._choices[index] = self._new_choice(index)
            if self.chat:
                self._add_chat_delta(choice, delta_choice)
            else:
                self._add_text_delta(choice, delta_choice)
            if delta_choice.get("token_ids"):
                choice["token_ids"].extend(delta_choice["token_ids"])
                self.first_token_seen = True
            elif not self.first_token_seen and (
                delta_choice.get("text") or (delta_choice.get("delta") or {}).get("content")
            ):
                self.first_token_seen = True
            for key in ("finish_reason", "stop_reason"):
                if delta_choice.get(key) is not None:
                    choice[key] = delta_choice[key]
            if delta_choice.get("prompt_token_ids") is not None and choice.get("prompt_token_ids") is None:
                choice["prompt_token_ids"] = delta_choice["prompt_token_ids"]

    def _new_choice(self, index: int) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": None}
        else:
            choice["text"] = ""
        choice.update(logprobs=None, finish_reason=None, stop_reason=None, token_ids=[])
        return choice

    @staticmethod
    def _add_chat_delta(choice: dict[str, Any], delta_choice: dict[str, Any]) -> None:
        delta = delta_choice.get("delta") or {}
        message = choice["message"]
        for key, value in delta.items():
            if value is None:
                continue
            if key == "role":
                message["role"] = value
            elif key == "tool_calls":
                calls = message.setdefault("tool_calls", [])
                for call_delta in value:
                    _merge_tool_call(calls, call_delta)
            elif isinstance(value, str):
                message[key] = (message.get(key) or "") + value
            else:
                message[key] = value
        logprobs = delta_choice.get("logprobs")
        if logprobs and logprobs.get("content"):
            if choice["logprobs"] is None:
                choice["logprobs"] = {"content": []}
            choice["logprobs"]["content"].extend(logprobs["content"])

    @staticmethod
    def _add_text_delta(choice: dict[str, Any], delta_choice: dict[str, Any]) -> None:
        choice["text"] += delta_choice.get("text") or ""
        logprobs = delta_choice.get("logprobs")
        if logprobs:
            if choice["logprobs"] is None:
                choice["logprobs"] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
            for key, values in logprobs.items():
                if isinstance(values, list):
                    choice["logprobs"].setdefault(key, []).extend(values)

    def result(self) -> dict[str, Any]:
        """The response as the backend would have returned it without `stream`."""
        response: dict[str, Any] = {
            "id": self._top.get("id"),
            "object": "chat.completion" if self.chat else "text_completion",
        }
        response.update({k: v for k, v in self._top.items() if k != "id"})
        response["choices"] = [self._choices[i] for i in sorted(self._choices)]
        response["usage"] = self._usage
        return response


def _merge_tool_call(calls: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    index = delta.get("index", len(calls))
    while len(calls) <= index:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]
