"""The agent of the lowercase-words task: one chat call, rewarded for the share of lowercase words.

It asks the model (through `OPENAI_BASE_URL`, agl's proxy) for a short answer with the sampled
tokens' logprobs, and returns the share of generated tokens that are lowercase words (`the`,
` agent`, `ing`): a fixed subset of about a fifth of the tiny model's vocabulary. A random
model writes them a fifth of the time or so; training makes it write them more.

It talks HTTP with the standard library rather than the OpenAI SDK only because one process
starts per rollout and the SDK's import costs most of a second of CPU each time.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

MAX_TOKENS = 16
LOWERCASE_WORD = re.compile(r" ?[a-z]+")
RETRIES = 20


def is_lowercase_word(token: str) -> bool:
    """The rewarded vocabulary: tokens made of lowercase ASCII letters, with an optional leading space."""
    return LOWERCASE_WORD.fullmatch(token) is not None


def lowercase_share(tokens: Sequence[str]) -> float:
    """The reward: the share of `tokens` that are lowercase words (0.0 for no token)."""
    return sum(map(is_lowercase_word, tokens)) / len(tokens) if tokens else 0.0


def chat(body: dict[str, Any]) -> dict[str, Any]:
    """POST a chat completion to the proxy; waits out 429 (the proxy is paused for a weight update)."""
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
    )
    for _ in range(RETRIES):
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            if error.code != 429:
                raise
            time.sleep(float(error.headers.get("retry-after") or 1.0))
    raise RuntimeError(f"the proxy stayed paused through {RETRIES} retries")


class LowercaseWordsAgent:
    """`run()` → the reward of one rollout; the prompt comes from the task's `prompt` (`$PROMPT`)."""

    def run(self) -> float:
        answer = chat(
            {
                "model": os.environ["AGL_MODEL"],
                "messages": [{"role": "user", "content": os.environ["PROMPT"]}],
                "max_tokens": MAX_TOKENS,
                "temperature": 1.0,
                "logprobs": True,
            }
        )
        content = answer["choices"][0]["logprobs"]["content"] or []
        return lowercase_share([entry["token"] for entry in content])
