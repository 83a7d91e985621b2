"""The demo's agent: a plain OpenAI-SDK agent, three chat turns with a `lookup` tool in between.

It knows nothing of agl: it is given a base URL and a model name, as any OpenAI client is. Its
turns are examples/word_lookup's (the tool, and how a plain answer is followed by the agent's own
lookup call), so the follow-up calls send the model's answers back exactly as the SDK returned
them; that is what lets the proxy recognise them and bridge each next prompt from the ids the
model sampled. The reward is word_lookup's too: the share of generated tokens that are lowercase words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from examples.lowercase_words.agent import lowercase_share
from examples.word_lookup.agent import LOOKUP_TOOL, tool_messages

TURNS = 3
MAX_TOKENS = 8
TASKS = (
    "What is the weather in Paris today?",
    "Will it rain in London tomorrow?",
    "How windy is it in Tokyo?",
    "Is it sunny in Paris tomorrow?",
)


@dataclass(frozen=True)
class AgentResult:
    """What the rollout needs from the agent: its reward and how many model calls it made."""

    reward: float
    calls: int


async def run_agent(base_url: str, model: str, task: str) -> AgentResult:
    """`TURNS` chat calls on `base_url`, each answer looked up and appended before the next call."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=5)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    shares = []
    try:
        for turn in range(TURNS):
            response = await client.chat.completions.create(
                model=model,
                messages=messages,  # plain dicts, as agents write them
                tools=[LOOKUP_TOOL],
                max_tokens=MAX_TOKENS,
                temperature=1.0,
                logprobs=True,
            )
            choice = response.choices[0]
            content = choice.logprobs.content if choice.logprobs is not None else None
            shares.append(lowercase_share([entry.token for entry in content or []]))
            if turn < TURNS - 1:
                messages += tool_messages(choice.message, turn)
    finally:
        await client.close()
    return AgentResult(reward=sum(shares) / len(shares), calls=TURNS)
