"""A whole chat answer as the SSE chunks a streaming client reads.

The token chain samples with one `/inference/v1/generate` call and parses the ids once
(`/v1/chat/completions/derender`), so a streamed call gets its answer when it is complete:
per choice a role chunk, the reasoning, content and tool calls, then the finish reason, and
the usage chunk when `stream_options.include_usage` asks for it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson


def _chunk(response: Mapping[str, Any], choices: list[dict[str, Any]], **extra: Any) -> bytes:
    chunk = {
        "id": response.get("id"),
        "object": "chat.completion.chunk",
        "created": response.get("created"),
        "model": response.get("model"),
        "choices": choices,
        **extra,
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _deltas(choice: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    message = choice.get("message") or {}
    index = choice.get("index", 0)
    yield {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    delta: dict[str, Any] = {}
    if message.get("reasoning"):
        delta["reasoning"] = message["reasoning"]
    if message.get("content"):
        delta["content"] = message["content"]
    if delta or choice.get("token_ids"):
        yield {
            "index": index,
            "delta": delta,
            "logprobs": choice.get("logprobs"),
            "finish_reason": None,
            "token_ids": choice.get("token_ids"),
        }
    calls = [
        {"index": i, "id": call.get("id"), "type": "function", "function": call.get("function")}
        for i, call in enumerate(message.get("tool_calls") or ())
    ]
    if calls:
        yield {"index": index, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}
    yield {"index": index, "delta": {}, "logprobs": None, "finish_reason": choice.get("finish_reason")}


def sse_chunks(response: Mapping[str, Any], include_usage: bool) -> Iterator[bytes]:
    """The stream of `response` (a chat completion), `data: [DONE]` last."""
    first = True
    for choice in response.get("choices") or ():
        for delta in _deltas(choice):
            if first:
                yield _chunk(response, [delta], prompt_token_ids=response.get("prompt_token_ids"))
                first = False
            else:
                yield _chunk(response, [delta])
    if include_usage:
        yield _chunk(response, [], usage=response.get("usage"))
    yield b"data: [DONE]\n\n"
