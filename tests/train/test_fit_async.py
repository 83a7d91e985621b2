"""Async rollout through the real `AglTrainer.fit()` on the CPU: the lowercase-words task with
`async_train_batch_size` > `data.train_batch_size`, agents that call through the unmodified
OpenAI SDK with its default retries, and a drain bound short enough that calls still running
when an update starts are cancelled. One run serves every test of the module."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
import pytest

from examples.lowercase_words.train import Run, _environment, running_proxy

from .fit_runs import BATCH, N, async_overrides, fit, unique_tasks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.training,
    pytest.mark.vllm,
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

STEPS = 4  # 8 prompts: the data ends after 4 steps, before trainer.total_training_steps
CALL_TOKENS = 400  # long calls (of the 512 the tiny vLLM takes): some run on when an update pauses the proxy
GRPO_ADVANTAGE = 0.5**0.5  # two rollouts with different rewards: ±(r1 − r2)/2 over their std (unbiased)


@pytest.fixture(scope="module")
def run(dev_vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("fit-async")
    address = dev_vllm_server.root_url.removeprefix("http://")
    with running_proxy(out) as proxy_url, _environment("AGENT_MAX_TOKENS", str(CALL_TOKENS)):
        config = async_overrides(
            dev_vllm_server.model_path,
            proxy_url,
            out,
            [
                "agentlightning.update_drain_timeout_seconds=0.05",
                f"actor_rollout_ref.rollout.response_length={CALL_TOKENS}",
                "actor_rollout_ref.rollout.val_kwargs.n=2",
                "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
                "trainer.val_before_train=false",
                f"trainer.test_freq={STEPS}",
            ],
        )
        return fit(config, out, unique_tasks(STEPS * BATCH), unique_tasks(2), address)


def test_every_step_trains_the_first_groups_to_complete_and_carries_the_others(run: Run) -> None:
    assert [int(m["step"]) for m in run.history] == list(range(1, STEPS + 1))
    assert [m["rollout/n_groups_carried_over"] for m in run.history] == [2, 2, 2, 0]
    for metrics in run.history:
        assert metrics["rollout/n_groups"] == BATCH
        ended = metrics["rollout/n_done"] + metrics["rollout/n_failed"] + metrics["rollout/n_timed_out"]
        assert ended == BATCH * N
        assert metrics["training/n_update_rows"] > 0 and "actor/pg_loss" in metrics
    # The data ended the run: nothing was left to cancel.
    last = run.history[-1]
    assert (last["rollout/n_groups_cancelled_at_end"], last["rollout/n_prompts_not_trained"]) == (0, 0)


def test_agents_calling_during_the_weight_update_do_not_fail(run: Run) -> None:
    # The proxy holds calls while paused; a call still running at the drain bound is cancelled
    # (503), which the SDK retries. A rollout may fail only where a call was cancelled.
    cancelled = sum(m["rollout/proxy_calls_cancelled_at_update"] for m in run.history)
    failed = sum(m["rollout/n_failed"] + m["rollout/n_timed_out"] for m in run.history)
    print(f"\ncalls cancelled at the drain bound: {cancelled:.0f}; rollouts failed: {failed:.0f}")
    assert failed <= cancelled
    # The retry of a cancelled call is stored as a delta of the failed try, sharing only its
    # messages; it trains on its own ids like any other call.
    assert sum(m.get("training/n_llm_calls_skipped/no_prompt_token_ids", 0) for m in run.history) == 0


def test_nothing_is_left_running(run: Run) -> None:
    agents = [
        process
        for process in psutil.Process().children(recursive=True)
        if "agl_train.runner.launch" in " ".join(process.cmdline())
    ]
    assert agents == []
    statuses = asyncio.run(rollout_statuses(run.db_path))
    assert set(statuses) <= {"succeeded", "failed"}  # every rollout ended
    assert statuses.get("succeeded", 0) == sum(m["rollout/n_done"] for m in run.history)
    assert sum(statuses.values()) == STEPS * BATCH * N  # each prompt rolled out once


async def rollout_statuses(db_path: Path) -> dict[str, int]:
    from collections import Counter

    from agl_store.sqlite import SQLiteStore

    store = await SQLiteStore(str(db_path)).open()
    try:
        return dict(Counter(rollout.status for rollout in await store.query_rollouts(mode="train")))
    finally:
        await store.close()


def test_the_metrics_a_verl_user_looks_for(run: Run) -> None:
    for metrics in run.history:
        assert metrics["actor/entropy"] > 0
        assert metrics["perf/throughput"] > 0 and metrics["perf/time_per_step"] > 0
        # verl's names carry GRPO's advantages; agl's per-rollout normalised ones have their own.
        # verl divides by std + 1e-6, which moves |A| below 1/sqrt(2) by a factor d / (d + sqrt(2) * 1e-6) for
        # a group whose two rewards differ by d: rel=1e-3 holds for every gap of 1.5e-3 or more.
        for key in ("critic/advantages/max", "critic/advantages/min"):
            assert abs(metrics[key]) == pytest.approx(GRPO_ADVANTAGE, rel=1e-3) or metrics[key] == 0
        assert "training/advantages_normalized/mean" in metrics
        assert metrics["rollout/n_dropped_spans_not_exported"] == 0
    validation = run.history[-1]
    assert validation["val/n_done"] == 2 * 2  # val_kwargs.n rollouts of each validation task
    assert "val-core/unknown/reward/mean@2" in validation and "val-aux/unknown/reward/std@2" in validation


def test_every_trained_call_ran_with_the_rollout_sampling(run: Run) -> None:
    assert [m["rollout/n_calls_off_sampling"] for m in run.history] == [0] * STEPS
    assert [m["training/n_rows_off_sampling"] for m in run.history] == [0] * STEPS
