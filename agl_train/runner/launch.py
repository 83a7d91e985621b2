"""`python -m agl_train.runner.launch module:Class`: run one agent in a rollout's process.

The agent class is instantiated without arguments and its `run()` is called (awaited when it
is a coroutine). It reads its task from the environment (`env_map` variables, `AGL_INPUT`)
and calls the model at `OPENAI_BASE_URL` / `AGL_BASE_URL`. What `run()` returns is the
rollout's reward: a number, `{"reward": number}`, or None for no reward. The launcher prints
it as the last stdout line, `AGL_RESULT {"reward": ...}`, which the runner records in the
store as an `agl.reward` span.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import sys
from typing import Any

from .env import RESULT_PREFIX


def load_agent_class(spec: str) -> Any:
    """`package.module:Class` (or `package.module.Class`) → the class; errors say what is missing."""
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        module_name, _, attribute = spec.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"agent_class {spec!r} must look like 'package.module:ClassName'")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r} (agent_class {spec!r})") from None


def reward_payload(result: Any) -> dict[str, float | None]:
    """`run()`'s return value as `{"reward": float | None}`; anything else is a TypeError."""
    if isinstance(result, dict):
        result = result.get("reward")
    if result is None:
        return {"reward": None}
    if isinstance(result, bool) or not isinstance(result, (int, float)) or not math.isfinite(result):
        raise TypeError(f"the agent's run() must return a finite number, {{'reward': number}} or None; got {result!r}")
    return {"reward": float(result)}


def run_agent(spec: str) -> dict[str, float | None]:
    """Instantiate the agent, run it once, return the reward payload."""
    agent = load_agent_class(spec)()
    result = agent.run()
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return reward_payload(result)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m agl_train.runner.launch package.module:AgentClass", file=sys.stderr)
        return 2
    payload = run_agent(argv[0])
    sys.stdout.flush()
    print(RESULT_PREFIX + json.dumps(payload), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
