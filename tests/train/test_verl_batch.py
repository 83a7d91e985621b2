"""Rows into verl: the DataProto, rollout-level advantage against verl's own, the update batch."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_train.algo.advantage import small_group_advantage
from agl_train.core.aggregate import Limits, Row
from agl_train.verl_glue._verl import DataProto, compute_advantage
from agl_train.verl_glue.verl_batch import (
    compute_rollout_level_advantage,
    normalize_batch_advantages,
    select_update_batch,
    to_data_proto,
)

LIMITS = Limits(max_prompt_length=4, max_response_length=6)
SQRT_HALF = 0.5**0.5


def make_row(rollout_id: str, uid: str, reward: float, n_generated: int = 2, turn_index: int = 0, **kw) -> Row:
    response = list(range(10, 10 + n_generated)) + [50]
    return Row(
        rollout_id=rollout_id,
        uid=uid,
        turn_index=turn_index,
        prompt_ids=[1, 2],
        response_ids=response,
        response_mask=[1] * n_generated + [0],
        logprobs=[-0.1] * len(response),
        reward=reward,
        **kw,
    )


def batch(rows: Sequence[Row]) -> DataProto:
    data = to_data_proto(rows, LIMITS, pad_token_id=0)
    data.batch["token_level_rewards"] = data.batch["token_level_scores"].clone()
    return data


def first_token_advantages(data: DataProto) -> list[float]:
    return [round(v, 4) for v in data.batch["advantages"][:, 0].tolist()]


def test_the_data_proto_has_what_verls_ppo_reads() -> None:
    data = to_data_proto([make_row("ro-a", "q1", 1.0), make_row("ro-b", "q1", 0.0, turn_index=2)], LIMITS, 0)

    assert set(data.batch.keys()) >= {
        "prompts",
        "responses",
        "input_ids",
        "attention_mask",
        "position_ids",
        "response_mask",
        "token_level_scores",
        "rollout_log_probs",
        "is_drop_mask",
    }
    assert data.batch["input_ids"].shape == (2, 10)
    assert data.non_tensor_batch["uid"].tolist() == ["q1", "q1"]
    assert data.non_tensor_batch["rollout_id"].tolist() == ["ro-a", "ro-b"]
    assert data.non_tensor_batch["turn_index"].tolist() == [0, 2]


def test_a_rollout_split_into_three_rows_counts_once_in_its_grpo_group() -> None:
    # ro-a (reward 1) became 3 rows, ro-b (reward 0) 1 row. Over rollouts: mean 0.5, std
    # (unbiased) √0.5, so a = ±0.5 / √0.5 = ±√0.5 on every generated token.
    rows = [make_row("ro-a", "q1", 1.0, turn_index=i) for i in range(3)] + [make_row("ro-b", "q1", 0.0)]

    data = compute_rollout_level_advantage(batch(rows), "grpo")

    assert first_token_advantages(data) == [round(SQRT_HALF, 4)] * 3 + [round(-SQRT_HALF, 4)]
    assert data.batch["advantages"][:, 2].tolist() == [0.0] * 4  # inserted tokens get none
    # Row-level GRPO would count ro-a three times: mean 0.75, std 0.5 → 0.5, 0.5, 0.5, -1.5.
    row_level = compute_advantage(batch(rows), adv_estimator="grpo")
    assert first_token_advantages(row_level) == [0.5, 0.5, 0.5, -1.5]


def test_a_group_with_equal_rewards_has_no_advantage() -> None:
    rows = [make_row("ro-a", "q1", 1.0), make_row("ro-a", "q1", 1.0, turn_index=1), make_row("ro-b", "q1", 1.0)]

    data = compute_rollout_level_advantage(batch(rows), "grpo")

    assert data.batch["advantages"].abs().sum().item() == 0.0


def test_rows_of_one_rollout_with_different_rewards_are_an_error() -> None:
    with pytest.raises(ValueError, match="different rewards"):
        compute_rollout_level_advantage(batch([make_row("ro-a", "q1", 1.0), make_row("ro-a", "q1", 0.0)]), "grpo")


@pytest.mark.parametrize(
    "estimator, kwargs",
    [("grpo", {}), ("grpo", {"norm_adv_by_std_in_grpo": False}), ("rloo", {}), ("reinforce_plus_plus_baseline", {})],
)
def test_with_one_row_per_rollout_it_equals_verls_compute_advantage(estimator: str, kwargs: dict) -> None:
    rng = random.Random(7)
    rows = [
        make_row(f"ro-{g}-{i}", f"q{g}", float(rng.randint(0, 4)) / 4, n_generated=rng.randint(1, 5))
        for g in range(3)
        for i in range(4)
    ]
    ours = compute_rollout_level_advantage(batch(rows), estimator, **kwargs)
    verl = compute_advantage(batch(rows), adv_estimator=estimator, **kwargs)

    torch.testing.assert_close(ours.batch["advantages"], verl.batch["advantages"])
    torch.testing.assert_close(ours.batch["returns"], verl.batch["returns"])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2), st.sampled_from([0.0, 0.5, 1.0]), st.lists(st.integers(1, 5), min_size=1, max_size=4)
        ),
        min_size=2,
        max_size=8,
    )
)
def test_rollout_level_advantage_equals_the_advantage_with_one_row_per_rollout(
    rollouts: list[tuple[int, float, list[int]]],
) -> None:
    split = [
        make_row(f"ro-{r}", f"q{group}", reward, n_generated=n, turn_index=t)
        for r, (group, reward, sizes) in enumerate(rollouts)
        for t, n in enumerate(sizes)
    ]
    one_each = [make_row(f"ro-{r}", f"q{group}", reward) for r, (group, reward, _) in enumerate(rollouts)]

    per_row = compute_rollout_level_advantage(batch(split), "grpo").batch["advantages"]
    verls = compute_advantage(batch(one_each), adv_estimator="grpo").batch["advantages"][:, 0]
    # ... except that a group of one rollout has no advantage (verl's would be its raw reward).
    per_rollout, _ = small_group_advantage(verls, [f"q{group}" for group, _, _ in rollouts])

    rollout_of_row = [int(row.rollout_id[3:]) for row in split]
    expected = per_rollout[rollout_of_row].unsqueeze(-1) * batch(split).batch["response_mask"]
    torch.testing.assert_close(per_row, expected)


def test_the_update_batch_drops_marked_rows_then_keeps_whole_mini_batches() -> None:
    rows = [
        make_row("ro-a", "q1", 1.0),
        make_row("ro-b", "q1", 0.0, is_drop=True),
        make_row("ro-c", "q2", 1.0),
        make_row("ro-d", "q2", 1.0),
        make_row("ro-e", "q3", 0.0),
        make_row("ro-f", "q3", 1.0),
    ]
    data = compute_rollout_level_advantage(batch(rows), "grpo")

    kept, metrics = select_update_batch(
        data, ppo_mini_batch_size=1, rollout_n=2, max_ppo_update_times=None, rng=random.Random(0)
    )

    # 5 unmarked rows, mini-batch 2: one row goes, and it comes from q2 (equal rewards).
    assert len(kept) == 4
    assert not set(kept.non_tensor_batch["rollout_id"].tolist()) >= {"ro-c", "ro-d"}
    assert metrics == {
        "training/n_sample_dropped/marked": 1.0,
        "training/n_sample_dropped/same_reward": 1,
        "training/n_sample_dropped/random": 0,
    }


def test_normalising_the_batch_divides_by_rollout_tokens_times_rows() -> None:
    rows = [make_row("ro-a", "q1", 1.0, n_generated=2), make_row("ro-a", "q1", 1.0, n_generated=3, turn_index=1)]
    data = batch(rows)
    data.batch["advantages"] = data.batch["response_mask"].float()

    normalized = normalize_batch_advantages(data).batch["advantages"]

    assert normalized.sum().item() == pytest.approx(5 / (5 * 2))
    assert np.allclose(normalized[0, :2].numpy(), 1 / 10)


def test_fewer_rows_than_one_mini_batch_leave_an_empty_update_batch() -> None:
    data = compute_rollout_level_advantage(batch([make_row("ro-a", "q1", 1.0), make_row("ro-b", "q1", 0.0)]), "grpo")

    kept, metrics = select_update_batch(
        data, ppo_mini_batch_size=4, rollout_n=1, max_ppo_update_times=None, rng=random.Random(0)
    )

    assert len(kept) == 0 and kept.batch["advantages"].shape == (0, LIMITS.max_response_length)
    assert metrics["training/n_sample_dropped/random"] == 2
