"""`local` rollout execution: one subprocess per rollout running the configured agent class.

The child is `python -m agl_train.runner.launch <agent_class>` with the rollout's environment
(`env.rollout_env`) over the host's own. It runs in its own process group so that a timeout
kills the agent and anything it started, and it is sent SIGKILL when the thread that started it
ends (`PR_SET_PDEATHSIG` on Linux), so an agent never outlives a killed trainer and keeps calling
the proxy for a rollout that a resumed trainer runs again. Its last `AGL_RESULT` stdout line
carries the reward.

With `use_ray=True` the subprocess is started by a Ray task, so rollouts spread over the
nodes of the Ray cluster the trainer already runs on (verl's); nothing else changes.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agl_store.models import AttemptedRollout

from .env import MissingInputField, RolloutEndpoints, parse_result, rollout_env
from .outcome import RolloutOutcome

KILL_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL of a timed-out agent's process group."""
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A `preexec_fn` that has the kernel SIGKILL the child when its parent ends (Linux only;
    elsewhere a no-op). A parent already gone before the call leaves the child orphaned, so
    the child then exits at once."""

    def preexec() -> None:
        if not sys.platform.startswith("linux"):
            return
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


@dataclass(frozen=True)
class ProcessResult:
    """How an agent process ended: `timed_out`, else its exit code and output."""

    timed_out: bool
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""


async def run_process(
    command: Sequence[str], env: Mapping[str, str], timeout_s: float, cwd: str | None = None
) -> ProcessResult:
    """Run `command` with `env` over this host's environment; kill its process group past `timeout_s`."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
        cwd=cwd,
        start_new_session=True,
        preexec_fn=die_with_parent(os.getpid()),
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        await _kill_group(process)
        return ProcessResult(timed_out=True)
    except asyncio.CancelledError:
        await _kill_group(process)
        raise
    return ProcessResult(
        timed_out=False,
        returncode=process.returncode,
        stdout=stdout.decode(errors="replace"),
        stderr=stderr.decode(errors="replace"),
    )


def run_process_blocking(command: list[str], env: dict[str, str], timeout_s: float, cwd: str | None) -> ProcessResult:
    """`run_process` for a Ray task (a plain function on the remote node)."""
    return asyncio.run(run_process(command, env, timeout_s, cwd))


class LocalRunner:
    """Runs rollouts as subprocesses of `agent_class` (`package.module:Class`).

    ```python
    runner = LocalRunner("examples.calc_agent.agent:CalcAgent", {"QUESTION": "input.question"}, timeout_s=600)
    outcome = await runner.run(attempted_rollout, endpoints)
    await record_outcome(store, outcome)
    ```

    `extra_env` is added to every child's environment; `python` and `cwd` choose the
    interpreter and working directory of the children.
    """

    def __init__(
        self,
        agent_class: str,
        env_map: Mapping[str, str],
        timeout_s: float,
        *,
        python: str = sys.executable,
        cwd: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        use_ray: bool = False,
    ) -> None:
        if not agent_class:
            raise ValueError("LocalRunner needs agent_class ('package.module:ClassName')")
        self.agent_class = agent_class
        self.env_map = dict(env_map)
        self.timeout_s = timeout_s
        self.python = python
        self.cwd = cwd
        self.extra_env = dict(extra_env or {})
        self.use_ray = use_ray

    def command(self) -> list[str]:
        return [self.python, "-m", "agl_train.runner.launch", self.agent_class]

    async def run(self, rollout: AttemptedRollout, endpoints: RolloutEndpoints) -> RolloutOutcome:
        """Run one attempt to its end; never raises for the agent's own failures."""
        rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
        try:
            env = {**self.extra_env, **rollout_env(rollout_id, attempt_id, rollout.input, self.env_map, endpoints)}
        except MissingInputField as exc:
            return RolloutOutcome(rollout_id, attempt_id, "failed", message=f"env_map: {exc}")
        if self.use_ray:
            result = await _run_on_ray(self.command(), env, self.timeout_s, self.cwd)
        else:
            result = await run_process(self.command(), env, self.timeout_s, self.cwd)
        if result.timed_out:
            message = f"killed after the rollout timeout of {self.timeout_s:g} s"
            return RolloutOutcome(rollout_id, attempt_id, "timeout", message=message)
        if result.returncode != 0:
            message = result.stderr or result.stdout
            return RolloutOutcome(rollout_id, attempt_id, "failed", message=message, exit_code=result.returncode)
        payload = parse_result(result.stdout)
        reward = None if payload is None else payload.get("reward")
        return RolloutOutcome(rollout_id, attempt_id, "succeeded", reward=reward, exit_code=0)


async def _run_on_ray(command: list[str], env: dict[str, str], timeout_s: float, cwd: str | None) -> ProcessResult:
    import ray

    remote = ray.remote(num_cpus=1)(run_process_blocking)
    return await remote.remote(command, env, timeout_s, cwd)


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGTERM the child's process group, then SIGKILL what is left of it, and reap the child."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), KILL_GRACE_S)
    except TimeoutError:
        pass
    # The agent's own children share its group and may outlive it: the group goes too.
    _signal_group(process.pid, signal.SIGKILL)
    await process.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
