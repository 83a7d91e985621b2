"""The local runner: a real agent subprocess calls the tiny vLLM through agl's proxy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agl_store.models import RolloutConfig
from agl_train.runner.dispatch import RolloutDispatcher
from agl_train.runner.groups import GroupTracker
from agl_train.runner.local import LocalRunner
from agl_train.runner.outcome import METADATA_KEY

from .conftest import REPO_ROOT

pytestmark = pytest.mark.slow
CALC_ENV = {"CALC_MAX_TOKENS": "16", "CALC_MAX_TURNS": "2", "CALC_MAX_RETRIES": "2"}


async def run_group(stack, runner, tasks, n=1, timeout_s=120.0):
    """Enqueue one group per task, run them with a dispatcher, return the completed groups."""
    tracker = GroupTracker(stack.store, n, rollout_config=RolloutConfig(timeout_seconds=600))
    dispatcher = RolloutDispatcher(stack.store, runner, max_concurrency=2, store_url=stack.store_url)
    await dispatcher.start()
    try:
        await tracker.submit(tasks, resources_id=stack.resources_id)
        dispatcher.wake()
        collected = await tracker.collect(len(tasks), timeout_s=timeout_s)
    finally:
        await dispatcher.stop()
    assert len(collected.groups) == len(tasks)
    return collected


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie waiting for its new parent to reap it is dead


async def test_the_calc_agent_runs_through_the_proxy_and_its_reward_reaches_the_store(stack) -> None:
    runner = LocalRunner(
        "examples.calc_agent.agent:CalcAgent",
        {"QUESTION": "input.question", "ANSWER": "input.answer"},
        timeout_s=120,
        cwd=str(REPO_ROOT),
        extra_env=CALC_ENV,
    )
    collected = await run_group(stack, runner, [{"question": "What is 6 * 7?", "answer": "42"}])

    rollout_id = collected.groups[0].rollout_ids[0]
    assert collected.counts == {"succeeded": 1, "failed": 0, "timeout": 0}
    calls = await stack.store.query_spans(rollout_id, "latest", name="agl.llm_call")
    rewards = await stack.store.query_spans(rollout_id, "latest", name="agl.reward")
    assert calls and all(call.attributes["agl.prompt_token_ids"] for call in calls)
    # A random-weight model does not answer 42: the reward is 0, recorded after the calls.
    assert [r.attributes["agl.reward.value"] for r in rewards] == [0.0]
    assert rewards[0].sequence_id > calls[-1].sequence_id


async def test_env_map_and_agl_variables_reach_the_agent(stack, tmp_path: Path) -> None:
    echo = tmp_path / "env.json"
    runner = LocalRunner(
        "tests.train.agents:EnvEchoAgent",
        {"QUESTION": "input.question", "LEVEL": "input.meta.level"},
        timeout_s=60,
        cwd=str(REPO_ROOT),
        extra_env={"ECHO_FILE": str(echo), "REWARD": "0.75"},
    )
    collected = await run_group(stack, runner, [{"question": 'say "hi": now', "meta": {"level": 2}}])

    rollout_id = collected.groups[0].rollout_ids[0]
    attempt = await stack.store.get_latest_attempt(rollout_id)
    env = json.loads(echo.read_text())
    assert (env["QUESTION"], env["LEVEL"]) == ('say "hi": now', "2")
    assert (env["AGL_ROLLOUT_ID"], env["AGL_ATTEMPT_ID"]) == (rollout_id, attempt.attempt_id)
    assert env["OPENAI_BASE_URL"] == f"{stack.proxy.url}/rollout/{rollout_id}/attempt/{attempt.attempt_id}/v1"
    assert env["AGL_STORE_URL"] == stack.store_url and env["AGL_MODEL"] == "tiny"
    rewards = await stack.store.query_spans(rollout_id, name="agl.reward")
    assert [r.attributes["agl.reward.value"] for r in rewards] == [0.75]


async def test_a_missing_input_field_fails_only_that_rollout_with_a_clear_message(stack, tmp_path: Path) -> None:
    runner = LocalRunner(
        "tests.train.agents:EnvEchoAgent",
        {"QUESTION": "input.question"},
        timeout_s=60,
        cwd=str(REPO_ROOT),
        extra_env={"ECHO_FILE": str(tmp_path / "env.json")},
    )
    collected = await run_group(stack, runner, [{"question": "q"}, {"prompt": "no question here"}])

    assert collected.counts == {"succeeded": 1, "failed": 1, "timeout": 0}
    failed = next(g for g in collected.groups if not g.succeeded())
    rollout = await stack.store.get_rollout_by_id(failed.rollout_ids[0])
    attempt = await stack.store.get_latest_attempt(failed.rollout_ids[0])
    assert rollout.status == "failed" and attempt.status == "failed"
    assert "no field 'input.question'" in attempt.metadata[METADATA_KEY]["message"]


async def test_an_agent_that_raises_fails_its_rollout_with_the_traceback(stack) -> None:
    runner = LocalRunner("tests.train.agents:FailingAgent", {}, timeout_s=60, cwd=str(REPO_ROOT))
    collected = await run_group(stack, runner, [{"question": "q"}])

    attempt = await stack.store.get_latest_attempt(collected.groups[0].rollout_ids[0])
    assert collected.counts["failed"] == 1
    assert "the agent broke on purpose" in attempt.metadata[METADATA_KEY]["message"]
    assert attempt.metadata[METADATA_KEY]["exit_code"] == 1


async def test_past_the_timeout_the_agent_and_its_children_are_killed_and_the_rollout_fails(
    stack, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    runner = LocalRunner(
        "tests.train.agents:SleepyAgent", {}, timeout_s=3, cwd=str(REPO_ROOT), extra_env={"ECHO_FILE": str(pids)}
    )
    collected = await run_group(stack, runner, [{"question": "q"}])

    rollout_id = collected.groups[0].rollout_ids[0]
    rollout = await stack.store.get_rollout_by_id(rollout_id)
    attempt = await stack.store.get_latest_attempt(rollout_id)
    assert collected.counts == {"succeeded": 0, "failed": 0, "timeout": 1}
    assert (rollout.status, attempt.status) == ("failed", "timeout")
    assert "rollout timeout of 3 s" in attempt.metadata[METADATA_KEY]["message"]
    agent_pid, child_pid = map(int, pids.read_text().split())
    assert process_gone(agent_pid) and process_gone(child_pid)


async def test_the_trainer_asks_a_replica_for_the_name_it_serves(vllm_server) -> None:
    from agl_train.runner.proxy_control import served_model_name

    address = vllm_server.base_url.removeprefix("http://").removesuffix("/v1")
    assert await served_model_name(address) == vllm_server.model
    assert await served_model_name(vllm_server.base_url) == vllm_server.model
