"""The agent of the word-lookup task: three chat turns with a glossary tool, rewarded on every turn.

A plain OpenAI-SDK agent: `OpenAI()` takes its base URL and key from `OPENAI_BASE_URL` /
`OPENAI_API_KEY` (agl's proxy and the agents' key), and every request offers the `lookup`
tool. Each turn the model writes a few tokens, sampled freely at temperature 1; they go through
`lookup` (a fixed weather glossary), whose answer is appended as a tool result before the next
turn. A model that calls the tool itself gets its call run as it made it; one that answers in
plain text (the tiny random model always does) gets its answer looked up by the agent, which
records that call as an assistant turn of its own after the answer. The answer itself goes back
as the SDK returned it, so the proxy recognises it and bridges the next prompt from the ids the
model sampled (agl_proxy/chain/backend.py). The
reward is the mean over the turns of the share of generated tokens that are lowercase words
(`examples.lowercase_words.agent.lowercase_share`).

The task (`AGL_INPUT`) is `{"prompt": str}` and optionally `"system"`, a system prompt with
`{turn}` in it, rewritten before every call: it changes the start of every prompt, as a turn
counter or a timestamp does, so each call of such a rollout becomes a row of its own (see
README.md). A task may also carry vLLM's `allowed_token_ids`, passed on as they are (the tests
force equal answers with one allowed token); the example's tasks do not.
"""

from __future__ import annotations

import json
import os
from typing import Any

from examples.lowercase_words.agent import lowercase_share

TURNS = 3
MAX_TOKENS = 8
MAX_RETRIES = 20  # the SDK waits out 429 (the proxy paused for a weight update) with Retry-After
GLOSSARY = frozenset(
    "weather city paris london tokyo today tomorrow temperature sunny rain cloud wind "
    "one two three four five six seven eight nine ten".split()
)
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"words": {"type": "string"}}, "required": ["words"]},
    },
}


def lookup(words: str) -> str:
    """The tool: which of `words` the glossary knows, as `known: a b (2 of 5)`."""
    given = words.split()
    known = [word for word in given if word.lower() in GLOSSARY]
    return f"known: {' '.join(known)} ({len(known)} of {len(given)})"


def tool_messages(message: Any, turn: int) -> list[dict[str, Any]]:
    """What follows the model's answer in the history: the answer as the SDK returned it, the
    agent's own `lookup` call when the model made none, and the tool results."""
    answer = message.model_dump(exclude_none=True)
    calls = answer.get("tool_calls", [])
    messages = [answer]
    if not calls:  # a plain answer: the agent looks its words up for the model, as a turn of its own
        arguments = json.dumps({"words": message.content or ""}, ensure_ascii=False)
        calls = [{"id": f"lookup_{turn}", "type": "function", "function": {"name": "lookup", "arguments": arguments}}]
        messages.append({"role": "assistant", "content": "", "tool_calls": calls})
    for call in calls:
        try:
            words = str(json.loads(call["function"]["arguments"]).get("words", ""))
        except (ValueError, AttributeError):
            words = ""
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": lookup(words)})
    return messages


class WordLookupAgent:
    """`run()` → the reward of one rollout: `TURNS` calls, each answer looked up between them."""

    def run(self) -> float:
        from openai import OpenAI

        task = json.loads(os.environ["AGL_INPUT"])
        client = OpenAI(max_retries=MAX_RETRIES)
        messages: list[dict[str, Any]] = [{"role": "user", "content": task["prompt"]}]
        if "system" in task:
            messages.insert(0, {"role": "system", "content": ""})
        shares = []
        for turn in range(TURNS):
            if "system" in task:
                messages[0]["content"] = task["system"].format(turn=turn + 1)
            choice = client.chat.completions.create(
                model=os.environ["AGL_MODEL"],
                messages=messages,
                tools=[LOOKUP_TOOL],
                max_tokens=MAX_TOKENS,
                temperature=1.0,  # the trainer imposes its rollout temperature on the proxy anyway
                logprobs=True,
                extra_body={"allowed_token_ids": task["allowed_token_ids"]} if "allowed_token_ids" in task else None,
            ).choices[0]
            content = choice.logprobs.content if choice.logprobs is not None else None
            shares.append(lowercase_share([entry.token for entry in content or []]))
            if turn < TURNS - 1:
                messages += tool_messages(choice.message, turn)
        return sum(shares) / len(shares)
