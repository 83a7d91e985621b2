"""The agent: an unmodified OpenAI-SDK tool-calling loop. agl only gives it a base URL.

Run by agl's local runner as `CalcAgent().run()` in its own process, with:
- `QUESTION`, `ANSWER`: the task (from the rollout input, through `env_map`);
- `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `AGL_MODEL`: set by agl (the rollout's proxy URL).
`run()` returns the reward: 1.0 when the final answer equals `ANSWER`, else 0.0.
"""

from __future__ import annotations

import json
import os
from typing import Any

from openai import OpenAI

from examples.calc_agent.calculator import calculate, final_number, format_number

SYSTEM_PROMPT = (
    "You are a careful math assistant. Use the calculator tool for arithmetic. "
    "When you know the result, reply with 'ANSWER: <number>'."
)
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 12"}},
            "required": ["expression"],
        },
    },
}


def tool_result(arguments: str) -> str:
    """The calculator's answer to one tool call, or the error the model should see."""
    try:
        expression = json.loads(arguments or "{}").get("expression", "")
        return format_number(calculate(str(expression)))
    except (ValueError, TypeError, ArithmeticError, AttributeError, json.JSONDecodeError) as exc:
        return f"error: {exc}"


class CalcAgent:
    """Answers one arithmetic question with up to `CALC_MAX_TURNS` model calls."""

    def __init__(self) -> None:
        self.question = os.environ["QUESTION"]
        self.answer = os.environ.get("ANSWER")
        self.model = os.environ["AGL_MODEL"]
        self.max_turns = int(os.environ.get("CALC_MAX_TURNS", "4"))
        self.max_tokens = int(os.environ.get("CALC_MAX_TOKENS", "256"))
        # The proxy answers 429 + Retry-After while the trainer updates the weights: wait it out.
        self.client = OpenAI(max_retries=int(os.environ.get("CALC_MAX_RETRIES", "30")))

    def run(self) -> float:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.question},
        ]
        final = ""
        for _ in range(self.max_turns):
            response = self.client.chat.completions.create(
                model=self.model, messages=messages, tools=[CALCULATOR_TOOL], max_tokens=self.max_tokens
            )
            message = response.choices[0].message
            if not message.tool_calls:
                final = message.content or ""
                break
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": tool_result(call.function.arguments)}
                )
        return self.reward(final)

    def reward(self, final: str) -> float:
        if self.answer is None:
            return 0.0
        got = final_number(final)
        return 1.0 if got is not None and abs(got - float(self.answer)) < 1e-6 else 0.0
