"""One rollout of the first task straight against vLLM, before training: an agent that cannot finish one
rollout fails here with its own error rather than as a step of failed rollouts."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from ..runner.env import RolloutEndpoints, parse_result, rollout_env
from ..runner.local import run_process
from .errors import RunFileError
from .run_file import RunFile

PREFLIGHT_TIMEOUT_S = 300.0


def check_one_rollout(run: RunFile, base_url: str, model: str, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> float | None:
    """Run the agent on `run.tasks[0]` against the OpenAI-compatible server at `base_url` (serving `model`);
    returns its reward. RunFileError quotes the agent's error when it fails, times out or reports nothing."""
    env = {
        **run.agent_env(),
        **rollout_env("preflight", "preflight", run.tasks[0], run.env_map, RolloutEndpoints(base_url, model)),
    }
    command = [sys.executable, "-m", "agl_train.runner.launch", run.agent_class]
    result = asyncio.run(run_process(command, env, timeout_s, cwd=str(Path.cwd())))
    if result.timed_out:
        raise RunFileError(run.where, "agent", f"one rollout of task 1 did not end in {timeout_s:.0f} s")
    payload = parse_result(result.stdout)
    if result.returncode != 0 or payload is None:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise RunFileError(run.where, "agent", f"one rollout of task 1 failed (exit code {result.returncode}):\n{tail}")
    reward = payload.get("reward")
    return None if reward is None else float(reward)
