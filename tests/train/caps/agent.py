"""An OpenAI-SDK agent with one tool, written from docs/trainer.md alone: it answers in capital letters.

`CapsAgent().run()` asks the model to repeat the task's `TEXT` in capitals, offering a `count_capitals`
tool; when the model calls it, the count goes back and the model answers again (two calls at most).
The reward is the share of capital letters among the letters of the final answer (partial credit, so
the rollouts of one task differ).
"""

from __future__ import annotations

import json
import os
from typing import Any

from openai import OpenAI

COUNT_TOOL = {
    "type": "function",
    "function": {
        "name": "count_capitals",
        "description": "Count the capital letters of a text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}


def capital_share(text: str) -> float:
    """The share of capital letters among the letters of `text` (0 without letters)."""
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / len(letters) if letters else 0.0


def count_capitals(arguments: str) -> str:
    try:
        text = str(json.loads(arguments or "{}").get("text", ""))
    except json.JSONDecodeError as exc:
        return f"error: {exc}"
    return str(sum(c.isupper() for c in text))


class CapsAgent:
    """Repeats `TEXT` in capital letters, with the `count_capitals` tool at hand."""

    def __init__(self) -> None:
        self.text = os.environ["TEXT"]
        self.client = OpenAI(max_retries=30)  # the proxy answers 503 + Retry-After during a weight update

    def run(self) -> float:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Repeat in capital letters: {self.text}"}]
        answer = ""
        for _ in range(2):
            response = self.client.chat.completions.create(
                model=os.environ["AGL_MODEL"], messages=messages, tools=[COUNT_TOOL], max_tokens=16
            )
            message = response.choices[0].message
            answer = message.content or ""
            if not message.tool_calls:
                break
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": count_capitals(call.function.arguments)}
                )
        return capital_share(answer)
