"""Capture real request/response examples from the tiny vLLM for ``docs/vllm-wire.md``.

Usage: ``python -m tests.support.capture_wire [BASE_URL] > /tmp/wire.md``. Without BASE_URL it starts the
tiny vLLM itself. Long arrays are trimmed to their first items plus a count, so the examples stay readable.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from examples.tiny_vllm.vllm_server import build_tiny_model, running_vllm_server

from .conversations import tool_history, tools

_KEEP = 6  # items kept from a long array


def trim(value: Any) -> Any:
    """Shorten long lists (token ids, logprobs) recursively, leaving a marker with the number dropped."""
    if isinstance(value, list):
        kept = [trim(v) for v in value[:_KEEP]]
        if len(value) > _KEEP + 1:
            return [*kept, f"... {len(value) - _KEEP} more"]
        return [trim(v) for v in value]
    if isinstance(value, dict):
        return {k: trim(v) for k, v in value.items()}
    return value


def _json(value: Any) -> str:
    return _pretty(trim(value), 0)


def _pretty(value: Any, indent: int) -> str:
    """JSON with short containers on one line, so token-id arrays do not take a line per id."""
    flat = json.dumps(value, ensure_ascii=False)
    if len(flat) + indent <= 100 or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {_pretty(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{_pretty(v, indent + 2)}" for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def _compact(value: Any) -> str:
    return json.dumps(trim(value), ensure_ascii=False)


def _section(title: str, method: str, path: str, body: Any, response: httpx.Response, stream: bool) -> str:
    parts = [f"### {title}\n", f"`{method} {path}`\n", f"```json\n{_json(body)}\n```\n" if body is not None else ""]
    parts.append(f"Response: HTTP {response.status_code}, `content-type: {response.headers.get('content-type')}`\n")
    if stream:
        lines = []
        for line in response.text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                lines.append("data: " + _compact(json.loads(line[6:])))
            elif line:
                lines.append(line)
        parts.append("```text\n" + "\n".join(lines) + "\n```\n")
    else:
        parts.append(f"```json\n{_json(response.json())}\n```\n")
    return "\n".join(p for p in parts if p)


def _examples(model: str) -> Iterator[tuple[str, str, str, Any, bool]]:
    """(title, method, path, body, stream) for every example in the doc, in order."""
    user = [{"role": "user", "content": "Hello there"}]
    chat = {"model": model, "messages": user, "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    completion = {"model": model, "prompt": "The weather in Paris is", "max_tokens": 4, "temperature": 0}
    yield "Models", "GET", "/v1/models", None, False
    yield "Chat, non-streamed, `return_token_ids`", "POST", "/v1/chat/completions", chat, False
    yield "Chat, streamed, `return_token_ids`", "POST", "/v1/chat/completions", {**chat, "stream": True}, True
    usage = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    yield "Chat, streamed, `stream_options.include_usage`", "POST", "/v1/chat/completions", usage, True
    yield (
        "Chat, without `return_token_ids` (the default)",
        "POST",
        "/v1/chat/completions",
        {k: v for k, v in chat.items() if k != "return_token_ids"},
        False,
    )
    eos = {**chat, "messages": [{"role": "user", "content": "Hi"}], "logit_bias": {"2": 100}}
    yield "Chat, stopped by EOS (`logit_bias` forces `<|im_end|>`, id 2)", "POST", "/v1/chat/completions", eos, False
    yield "Chat, stopped by EOS, streamed", "POST", "/v1/chat/completions", {**eos, "stream": True}, True
    stop = {**chat, "max_tokens": 8, "stop": ["sure"]}
    yield "Chat, stopped by a `stop` string", "POST", "/v1/chat/completions", stop, False
    yield "Completions, text prompt", "POST", "/v1/completions", {**completion, "return_token_ids": True}, False
    ids_prompt = {**completion, "prompt": [1, 228, 107, 506, 375, 131], "return_token_ids": True}
    yield "Completions, token-id prompt", "POST", "/v1/completions", ids_prompt, False
    batch = {**completion, "prompt": [[1, 228, 107], [550, 344]], "max_tokens": 2, "return_token_ids": True}
    yield "Completions, a batch of two token-id prompts", "POST", "/v1/completions", batch, False
    usage_option = {"stream": True, "stream_options": {"include_usage": True}}
    stream_completion = {**completion, "return_token_ids": True, **usage_option}
    yield "Completions, streamed", "POST", "/v1/completions", stream_completion, True
    n2 = {**chat, "n": 2, "temperature": 1.0, "seed": 7, "max_tokens": 3}
    yield "Chat, `n=2`", "POST", "/v1/chat/completions", n2, False
    yield "Chat, `n=2`, streamed", "POST", "/v1/chat/completions", {**n2, "stream": True}, True
    logprobs = {**chat, "max_tokens": 2, "logprobs": True, "top_logprobs": 0}
    yield "Chat, `logprobs: true, top_logprobs: 0`", "POST", "/v1/chat/completions", logprobs, False
    yield "Chat, logprobs, streamed", "POST", "/v1/chat/completions", {**logprobs, "stream": True}, True
    top2 = {**chat, "max_tokens": 1, "logprobs": True, "top_logprobs": 2}
    yield "Chat, `top_logprobs: 2`", "POST", "/v1/chat/completions", top2, False
    comp_lp = {**completion, "max_tokens": 2, "logprobs": 0, "return_token_ids": True}
    yield "Completions, `logprobs: 0`", "POST", "/v1/completions", comp_lp, False
    yield "Completions, `logprobs: 0`, streamed", "POST", "/v1/completions", {**comp_lp, "stream": True}, True
    auto = {**chat, "messages": tool_history(), "tools": tools(), "tool_choice": "auto", "max_tokens": 6}
    yield "Tools: a history with `tool_calls` and a `tool` result", "POST", "/v1/chat/completions", auto, False
    named = {
        **chat,
        "messages": tool_history()[1:2],
        "tools": tools(),
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 24,
    }
    yield "Tools: named `tool_choice` (guided decoding forces a call)", "POST", "/v1/chat/completions", named, False
    yield "Tools: named `tool_choice`, streamed", "POST", "/v1/chat/completions", {**named, "stream": True}, True
    too_long = {**chat, "messages": [{"role": "user", "content": "hello " * 600}]}
    yield "Error: prompt longer than `--max-model-len`", "POST", "/v1/chat/completions", too_long, False
    too_long_stream = {**too_long, "stream": True}
    yield "Error: prompt too long, streamed request", "POST", "/v1/chat/completions", too_long_stream, False
    yield "Error: `max_tokens` over the context", "POST", "/v1/chat/completions", {**chat, "max_tokens": 4096}, False
    yield "Error: unknown model", "POST", "/v1/chat/completions", {**chat, "model": "nope"}, False
    yield "Error: invalid parameter", "POST", "/v1/chat/completions", {**chat, "temperature": -1}, False
    yield (
        "Error: token id outside the vocabulary",
        "POST",
        "/v1/completions",
        {
            **completion,
            "prompt": [1, 999999],
        },
        False,
    )


def capture(base_url: str, model: str) -> str:
    """Run every example against ``base_url`` and return the markdown."""
    root = base_url.removesuffix("/v1")
    sections = []
    with httpx.Client(base_url=root, timeout=120) as client:
        for title, method, path, body, stream in _examples(model):
            response = client.request(method, path, json=body)
            sections.append(_section(title, method, path, body, response, stream))
    return "\n".join(sections)


def main(argv: list[str] | None = None) -> int:
    """Print the captured examples as markdown."""
    args = sys.argv[1:] if argv is None else argv
    if args:
        print(capture(args[0], args[1] if len(args) > 1 else "tiny-qwen2"))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        with running_vllm_server(build_tiny_model(), log_path=Path(tmp) / "vllm.log") as server:
            print(capture(server.base_url, server.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
