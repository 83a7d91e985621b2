"""Agents for the runner tests, run by `python -m agl_train.runner.launch tests.train.agents:NAME`."""

from __future__ import annotations

import json
import os
import sys
import time


class EnvEchoAgent:
    """Writes the environment it got to `$ECHO_FILE` and returns `$REWARD` as its reward."""

    def run(self) -> float:
        with open(os.environ["ECHO_FILE"], "w", encoding="utf-8") as handle:
            json.dump(
                {k: v for k, v in os.environ.items() if k.startswith(("AGL_", "OPENAI_", "QUESTION", "LEVEL"))}, handle
            )
        return float(os.environ.get("REWARD", "0.5"))


class AsyncAgent:
    """A coroutine `run()` with a `{"reward": ...}` result."""

    async def run(self) -> dict:
        return {"reward": 0.25}


class SleepyAgent:
    """Never finishes on its own: the runner's timeout must kill it (and its child)."""

    def run(self) -> float:
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(os.environ["ECHO_FILE"], "w", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {child.pid}")
        time.sleep(3600)
        return 1.0


class FailingAgent:
    def run(self) -> float:
        raise RuntimeError("the agent broke on purpose")


class CoinAgent:
    """Calls the model once through the unmodified OpenAI SDK; its reward is a coin flip
    decided by the rollout id (so a group of rollouts usually mixes 0 and 1)."""

    def run(self) -> float:
        import hashlib

        from openai import OpenAI

        client = OpenAI(max_retries=5)
        client.chat.completions.create(
            model=os.environ["AGL_MODEL"],
            messages=[{"role": "user", "content": os.environ["QUESTION"]}],
            max_tokens=8,
        )
        return float(hashlib.sha256(os.environ["AGL_ROLLOUT_ID"].encode()).digest()[0] % 2)


class SdkLowercaseAgent:
    """The lowercase-words agent (examples/lowercase_words) written as most agents are: one
    call through the unmodified OpenAI SDK with its default client (two retries), asking for
    `$AGENT_MAX_TOKENS` tokens exactly when set (else up to the example's 16)."""

    def run(self) -> float:
        from openai import OpenAI

        from examples.lowercase_words.agent import MAX_TOKENS, lowercase_share

        answer = OpenAI().chat.completions.create(
            model=os.environ["AGL_MODEL"],
            messages=[{"role": "user", "content": os.environ["PROMPT"]}],
            max_tokens=int(os.environ.get("AGENT_MAX_TOKENS", MAX_TOKENS)),
            logprobs=True,
            # The test that sets a long answer wants it long: vLLM's own option, passed through.
            extra_body={"ignore_eos": True} if "AGENT_MAX_TOKENS" in os.environ else None,
        )
        content = answer.choices[0].logprobs.content if answer.choices[0].logprobs else None
        return lowercase_share([entry.token for entry in content or []])
