"""One trainer step's data path on the CPU: enqueue → execute → wait → spans → rows →
advantages → update cap, with the real store, proxy, tiny vLLM and agent subprocesses."""

from __future__ import annotations

import random

import pytest
import torch

from agl_store.models import RolloutConfig
from agl_train.core.aggregate import Limits
from agl_train.runner.dispatch import RolloutDispatcher
from agl_train.runner.groups import GroupTracker
from agl_train.runner.local import LocalRunner
from agl_train.runner.proxy_control import ProxyControl
from agl_train.verl_glue.config import TrainSettings
from agl_train.verl_glue.step import rollout_step

from . import builders
from .conftest import REPO_ROOT

pytestmark = pytest.mark.slow

TASKS = [{"question": "What is 2 + 3?"}, {"question": "What is 7 * 6?"}, {"prompt": "this task has no question"}]


def train_settings(**changes) -> TrainSettings:
    return builders.train_settings(**{"limits": Limits(512, 512), "train_batch_size": 3, **changes})


@pytest.fixture
async def running(stack):
    """A dispatcher running the coin-flip agent (one model call, reward 0 or 1) for `stack`."""
    runner = LocalRunner(
        "tests.train.agents:CoinAgent", {"QUESTION": "input.question"}, timeout_s=120, cwd=str(REPO_ROOT)
    )
    dispatcher = RolloutDispatcher(stack.store, runner, max_concurrency=3, store_url=stack.store_url)
    control = ProxyControl(stack.proxy.url)
    await dispatcher.start()
    try:
        yield stack, control
    finally:
        await dispatcher.stop()
        await control.aclose()


async def test_one_step_from_prompts_to_the_update_batch(running, tokenizer) -> None:
    stack, control = running
    settings = train_settings()
    tracker = GroupTracker(stack.store, settings.rollout_n, rollout_config=RolloutConfig(timeout_seconds=600))

    step = await rollout_step(
        stack.store,
        tracker,
        TASKS,
        settings,
        rollout_timeout_s=120,
        pad_token_id=tokenizer.pad_token_id,
        rng=random.Random(0),
        adv_estimator="grpo",
        resources_id=stack.resources_id,
        proxy=control,
        tokenizer=tokenizer,
        trained_version=1,
    )

    metrics = step.metrics
    # The task without a question fails both its rollouts: counted, dropped, no crash.
    assert (metrics["rollout/n_done"], metrics["rollout/n_failed"], metrics["rollout/n_timed_out"]) == (4, 2, 0)
    assert metrics["training/n_rollouts"] == 4 and metrics["training/n_rows"] == 4  # one call each: one row each
    assert tracker.in_flight == []

    data = step.data
    assert data is not None and len(data) % 2 == 0  # whole mini-batches of ppo_mini_batch_size × n rows
    assert metrics["training/n_update_rows"] == len(data)
    # The stack registered its replica without a weight version: no trained token's version is known.
    assert metrics["training/off_policy/version_coverage"] == 0.0 and "sampling_versions" not in data.batch.keys()
    assert metrics["training/n_sample_dropped/same_reward"] + metrics["training/n_sample_dropped/random"] == 4 - len(
        data
    )
    mask = data.batch["response_mask"].bool()
    assert mask.any(dim=-1).all()
    advantages = data.batch["advantages"]
    assert torch.all(advantages[~mask] == 0)  # advantages live on generated tokens only
    rewards = data.batch["token_level_scores"].sum(-1)
    for row in range(len(data)):
        group = data.non_tensor_batch["uid"] == data.non_tensor_batch["uid"][row]
        group_rewards = rewards[torch.from_numpy(group)]
        values = advantages[row][mask[row]]
        assert torch.allclose(values, values[0])  # one scalar per rollout, broadcast
        if group_rewards.min() == group_rewards.max():
            assert values[0] == 0  # a group without reward spread has no advantage
        else:
            assert (values[0] > 0) == bool(rewards[row] == group_rewards.max())

    # Rows are what vLLM really returned: prompt ids from the span, the response ids the model generated.
    rollout_id = data.non_tensor_batch["rollout_id"][0]
    call = (await stack.store.query_spans(rollout_id, "latest", name="agl.llm_call"))[0]
    generated = call.attributes["agl.choices"][0]["token_ids"]
    assert data.batch["responses"][0, : len(generated)].tolist() == generated

    # verl's actor takes the batch as a no-padding tensordict: the conversion accepts it.
    from verl.workers.utils.padding import left_right_2_no_padding

    packed = left_right_2_no_padding(data.to_tensordict())
    lengths = [len(ids) for ids in packed["input_ids"].unbind(0)]
    assert lengths == data.batch["attention_mask"].sum(-1).tolist()


async def test_async_mode_trains_the_first_complete_groups_and_carries_the_rest(running, tokenizer) -> None:
    stack, control = running
    settings = train_settings(rollout_n=1, train_batch_size=1, async_rollout=True, async_train_batch_size=2)
    tracker = GroupTracker(stack.store, 1)
    common = dict(
        rollout_timeout_s=120,
        pad_token_id=tokenizer.pad_token_id,
        adv_estimator="grpo",
        resources_id=stack.resources_id,
        proxy=control,
        groups_to_train=1,
    )

    first = await rollout_step(stack.store, tracker, TASKS[:2], settings, rng=random.Random(0), **common)
    assert first.metrics["rollout/n_groups"] == 1 and first.metrics["rollout/n_groups_carried_over"] == 1
    carried = tracker.in_flight[0]

    second = await rollout_step(stack.store, tracker, [], settings, rng=random.Random(1), **common)
    assert second.collected.groups == [carried] and tracker.in_flight == []
    assert second.metrics["rollout/n_done"] == 1
