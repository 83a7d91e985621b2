"""Example chat requests for tests against the tiny model: plain messages, a tool, and a tool-call history.

The tiny model's random weights never produce a complete tool call, so a test that needs one puts it into
the history (``tool_history()``): an assistant turn with ``tool_calls`` and the ``tool`` result after it.
Each function returns a fresh copy, so a test may change what it gets.
"""

from __future__ import annotations

from typing import Any

TOOL_RESULT = '{"sky": "sunny", "celsius": 21}'


def messages() -> list[dict[str, Any]]:
    """A system prompt and one user question."""
    return [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the weather in Paris today?"},
    ]


def tools() -> list[dict[str, Any]]:
    """One OpenAI-style function tool, ``get_weather(city)``."""
    return [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]


def tool_history() -> list[dict[str, Any]]:
    """``messages()`` followed by an assistant call of ``get_weather`` (arguments as a JSON string) and its result."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    return [
        *messages(),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": TOOL_RESULT},
    ]
