"""One step's data path: succeeded rollouts → traces → batch → advantage → update batch →
per-rollout normalisation (the whole step with rollouts: test_rollout_step.py)."""

from __future__ import annotations

import asyncio
import gc
import random
from dataclasses import replace

import pytest

from agl_store import SQLiteStore
from agl_train.core.traces import LLMCall
from agl_train.runner.groups import Group, GroupTracker
from agl_train.verl_glue.step import (
    build_batch,
    mark_rollouts_dropped,
    off_sampling,
    prepare_update,
    read_succeeded,
    rollout_step,
)

from .builders import call, llm_call_span, reward, trace
from .builders import train_settings as settings


def group_traces():
    """q1: ro-a (reward 1) splits into 2 rows, ro-b (reward 0) is 1 row; q2: two equal rewards."""
    return [
        trace("ro-a", [call([1, 2], [3, 4]), call([9, 9], [5])], reward_value=1.0, uid="q1"),
        trace("ro-b", [call([1, 2], [6])], reward_value=0.0, uid="q1"),
        trace("ro-c", [call([1, 7], [8])], reward_value=1.0, uid="q2"),
        trace("ro-d", [call([1, 7], [8, 8])], reward_value=1.0, uid="q2"),
    ]


def rewards_in(data):
    data.batch["token_level_rewards"] = data.batch["token_level_scores"].clone()
    return data


def test_a_step_keeps_whole_mini_batches_and_weighs_every_rollout_the_same() -> None:
    s = settings()
    data, aggregation = build_batch(group_traces(), s, pad_token_id=0)
    assert len(data) == 5 and aggregation.metrics["training/n_prefix_breaks"] == 1

    update, metrics = prepare_update(rewards_in(data), s, rng=random.Random(0), adv_estimator="grpo")

    # 5 rows, mini-batch 1 × 2: one row goes, taken from q2 (equal rewards, no advantage).
    assert len(update) == 4
    assert metrics["training/n_sample_dropped/same_reward"] == 1
    assert metrics["training/n_sample_dropped/random"] == 0
    # ro-a's two rows together carry a / N, as much as ro-b's single row (N = 4 rows).
    per_rollout = {}
    for rollout_id, advantages in zip(update.non_tensor_batch["rollout_id"], update.batch["advantages"], strict=False):
        per_rollout[rollout_id] = per_rollout.get(rollout_id, 0.0) + float(advantages.sum())
    assert per_rollout["ro-a"] == pytest.approx(0.5**0.5 / 4, abs=1e-6)
    assert per_rollout["ro-b"] == pytest.approx(-(0.5**0.5) / 4, abs=1e-6)


def test_without_rollout_level_advantage_verl_sees_every_row() -> None:
    s = settings(enable_rollout_level_advantage=False, per_rollout_mean=False, rollout_n=1)
    data, _ = build_batch(group_traces(), s, pad_token_id=0)

    update, _ = prepare_update(rewards_in(data), s, rng=random.Random(0), adv_estimator="grpo")

    firsts = {
        r: round(float(a[0]), 4)
        for r, a in zip(update.non_tensor_batch["rollout_id"], update.batch["advantages"], strict=False)
    }
    # q1 over rows: rewards [1, 1, 0], mean 2/3, std √(1/3): ro-b gets -(2/3)/√(1/3).
    assert firsts["ro-b"] == round(-(2 / 3) / (1 / 3) ** 0.5, 4)


def test_no_rows_means_no_batch() -> None:
    data, aggregation = build_batch([trace("ro-a", [])], settings(), pad_token_id=0)

    assert data is None
    assert aggregation.metrics["training/n_rollouts_without_rows"] == 1


async def test_reads_in_flight_keep_the_groups_order(tmp_path) -> None:
    store = await SQLiteStore(str(tmp_path / "agl.db")).open()
    try:
        groups = []
        for g in range(3):
            rollout_ids = []
            for k in range(3):
                rollout = await store.start_rollout(input={"g": g})
                rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
                span = llm_call_span(range(20), range(10 * k + 1), rollout_id=rid, attempt_id=aid)
                await store.add_many_spans([span, reward(g + k / 10, rollout_id=rid, attempt_id=aid)])
                rollout_ids.append(rid)
            outcomes = {rid: "succeeded" for rid in rollout_ids}
            groups.append(Group(uid=f"g{g}", input={"g": g}, rollout_ids=rollout_ids, outcomes=outcomes))

        traces = await read_succeeded(store, groups, 0.0, in_flight=4)
    finally:
        await store.close()
    assert [t.rollout_id for t in traces] == [rid for group in groups for rid in group.rollout_ids]
    assert [t.uid for t in traces] == ["g0"] * 3 + ["g1"] * 3 + ["g2"] * 3
    assert [t.reward for t in traces] == [g + k / 10 for g in range(3) for k in range(3)]


class _CollectorWatch:
    """A store whose reads record whether the garbage collector runs; `fail` makes one raise."""

    def __init__(self, fail: str | None = None) -> None:
        self.fail, self.enabled = fail, []

    async def query_spans(self, rollout_id, *args, **kwargs):
        await asyncio.sleep(0)
        self.enabled.append(gc.isenabled())
        if rollout_id == self.fail:
            raise RuntimeError("read failed")
        return [reward(1.0, rollout_id=rollout_id, attempt_id="at-1")]


@pytest.mark.parametrize("fail", [None, "ro-2"])
async def test_the_collector_is_paused_during_the_batch_read_and_back_after(fail) -> None:
    ids = [f"ro-{i}" for i in range(4)]
    groups = [Group(uid="g", input={}, rollout_ids=ids, outcomes=dict.fromkeys(ids, "succeeded"))]
    store = _CollectorWatch(fail)
    assert gc.isenabled()
    if fail is None:
        traces = await read_succeeded(store, groups, 0.0, in_flight=2)
        assert [t.reward for t in traces] == [1.0] * 4
    else:
        with pytest.raises(RuntimeError, match="read failed"):
            await read_succeeded(store, groups, 0.0, in_flight=2)
    assert store.enabled and not any(store.enabled)
    assert gc.isenabled()
    gc.disable()  # paused by the caller: left paused
    try:
        await read_succeeded(_CollectorWatch(), groups, 0.0)
        assert not gc.isenabled()
    finally:
        gc.enable()


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 16}


def sampled(prompt, response, **changes) -> LLMCall:
    return replace(call(prompt, response), sampling=None if changes.get("none") else {**SAMPLING, **changes})


def test_calls_that_did_not_run_with_the_rollouts_sampling_are_found() -> None:
    traces = [
        trace("ro-ok", [sampled([1], [2]), sampled([1], [2], max_tokens=8)]),  # a lower cap changes no ratio
        trace("ro-hot", [sampled([1], [2]), sampled([1], [2], temperature=0.7)]),
        trace("ro-long", [sampled([1], [2], max_tokens=64)]),
        trace("ro-unsaid", [sampled([1], [2], none=True), sampled([1], [2], top_k=5)]),
    ]

    assert off_sampling(traces, SAMPLING) == {"ro-hot": 1, "ro-long": 1, "ro-unsaid": 2}


def test_rows_off_sampling_leave_the_update_after_counting_in_their_groups_advantage() -> None:
    s = settings()
    data, _ = build_batch(group_traces(), s, pad_token_id=0)

    assert mark_rollouts_dropped(data, {"ro-b"}) == 1
    update, metrics = prepare_update(rewards_in(data), s, rng=random.Random(0), adv_estimator="grpo")

    assert "ro-b" not in set(update.non_tensor_batch["rollout_id"])
    assert metrics["training/n_sample_dropped/marked"] == 1
    # ro-a still has GRPO's advantage against ro-b (verl's name), then agl's per-rollout share.
    assert metrics["critic/advantages/max"] == pytest.approx(0.5**0.5, abs=1e-5)  # GRPO: std + 1e-6
    assert metrics["training/advantages_normalized/max"] < metrics["critic/advantages/max"]


class SpansNeverExported:
    """A proxy whose span buffer never empties (an exporter stuck on a slow store)."""

    async def wait_spans_exported(self, timeout_s: float) -> bool:
        return False


async def test_a_step_whose_spans_are_not_all_written_trains_none_of_them(tmp_path, caplog) -> None:
    store = await SQLiteStore(str(tmp_path / "agl.db")).open()
    try:
        tracker = GroupTracker(store, 2)
        [group] = await tracker.submit([{"g": 0}])
        for rid in group.rollout_ids:
            await store.update_rollout(rid, status="succeeded")

        with caplog.at_level("WARNING", logger="agl_train.verl_glue.step"):
            step = await rollout_step(
                store,
                tracker,
                [],
                settings(train_batch_size=1),
                rollout_timeout_s=5,
                pad_token_id=0,
                rng=random.Random(0),
                groups_to_train=1,
                proxy=SpansNeverExported(),  # type: ignore[arg-type]
                span_export_wait_s=0.1,
            )
    finally:
        await store.close()
    assert step.data is None and step.metrics["rollout/n_done"] == 2
    assert step.metrics["rollout/n_dropped_spans_not_exported"] == 2
    assert "the 2 rollouts of this step are dropped" in caplog.text
