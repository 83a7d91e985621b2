"""Local rollouts scaled out on an existing Ray cluster: the agent process runs in a Ray task."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agl_store.models import Attempt, AttemptedRollout
from agl_train.runner.env import RolloutEndpoints
from agl_train.runner.local import LocalRunner

from .conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def attempted(task) -> AttemptedRollout:
    now = time.time()
    return AttemptedRollout(
        rollout_id="ro-ray",
        input=task,
        start_time=now,
        attempt=Attempt(rollout_id="ro-ray", attempt_id="at-1", sequence_id=1, start_time=now),
    )


async def test_the_agent_runs_as_a_ray_task_with_its_environment(ray_cluster, tmp_path: Path) -> None:
    echo = tmp_path / "env.json"
    runner = LocalRunner(
        "tests.train.agents:EnvEchoAgent",
        {"QUESTION": "input.question"},
        timeout_s=120,
        cwd=str(REPO_ROOT),
        extra_env={"ECHO_FILE": str(echo), "REWARD": "1"},
        use_ray=True,
    )
    outcome = await runner.run(attempted({"question": "q?"}), RolloutEndpoints(base_url="http://p/v1", model="m"))

    assert (outcome.status, outcome.reward) == ("succeeded", 1.0)
    env = json.loads(echo.read_text())
    assert (env["QUESTION"], env["AGL_ROLLOUT_ID"], env["OPENAI_BASE_URL"]) == ("q?", "ro-ray", "http://p/v1")


async def test_a_ray_task_past_the_timeout_is_killed(ray_cluster, tmp_path: Path) -> None:
    runner = LocalRunner(
        "tests.train.agents:SleepyAgent",
        {},
        timeout_s=2,
        cwd=str(REPO_ROOT),
        extra_env={"ECHO_FILE": str(tmp_path / "pids")},
        use_ray=True,
    )
    outcome = await runner.run(attempted({}), RolloutEndpoints(base_url="http://p/v1", model="m"))
    assert outcome.status == "timeout"
