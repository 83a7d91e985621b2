"""The max_ppo_update_times drop policy: whole mini-batches, same-reward rows go first."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_train.core.update_cap import (
    METRIC_DROPPED_RANDOM,
    METRIC_DROPPED_SAME_REWARD,
    cap_updates,
    kept_row_count,
    same_reward_rows,
)


def test_kept_rows_are_whole_mini_batches_capped_by_max_updates() -> None:
    assert kept_row_count(10, 4, None) == 8  # only the remainder goes
    assert kept_row_count(10, 4, 1) == 4
    assert kept_row_count(3, 4, None) == 0
    with pytest.raises(ValueError):
        kept_row_count(10, 4, 0)


def test_groups_whose_rewards_are_all_equal_are_found() -> None:
    uids = ["q1", "q1", "q2", "q2", "q3"]
    rewards = [1.0, 1.0, 1.0, 0.0, 0.0]

    assert same_reward_rows(uids, rewards) == [True, True, False, False, True]


def test_same_reward_rows_are_dropped_before_any_other_row() -> None:
    # 7 rows, mini-batch 2 × 2 = 4, cap 1: keep 4, drop 3. q1 (3 rows, all reward 1) has no
    # advantage, so its 3 rows go and the q2 rows all stay.
    uids = ["q1", "q2", "q1", "q2", "q1", "q2", "q2"]
    rewards = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]

    cap = cap_updates(uids, rewards, ppo_mini_batch_size=2, rollout_n=2, max_ppo_update_times=1, rng=random.Random(0))

    assert cap.keep == [1, 3, 5, 6]
    assert cap.metrics == {METRIC_DROPPED_SAME_REWARD: 3, METRIC_DROPPED_RANDOM: 0}


def test_when_same_reward_rows_run_out_the_rest_is_dropped_at_random() -> None:
    uids = ["q1", "q2", "q2", "q2", "q2"]
    rewards = [1.0, 1.0, 0.0, 1.0, 0.0]

    cap = cap_updates(uids, rewards, ppo_mini_batch_size=2, rollout_n=1, max_ppo_update_times=1, rng=random.Random(0))

    assert len(cap.keep) == 2 and 0 not in cap.keep
    assert cap.metrics == {METRIC_DROPPED_SAME_REWARD: 1, METRIC_DROPPED_RANDOM: 2}


@settings(max_examples=300, deadline=None)
@given(
    groups=st.lists(st.tuples(st.integers(1, 6), st.booleans()), min_size=1, max_size=8),
    mini_batch=st.integers(1, 4),
    n=st.integers(1, 3),
    cap=st.one_of(st.none(), st.integers(1, 4)),
    seed=st.integers(0, 1000),
)
def test_the_policy_keeps_whole_mini_batches_and_prefers_dropping_same_reward_rows(groups, mini_batch, n, cap, seed):
    uids, rewards = [], []
    for g, (size, varying) in enumerate(groups):
        for i in range(size):
            uids.append(f"q{g}")
            rewards.append(float(i % 2) if varying else 1.0)
    result = cap_updates(
        uids, rewards, ppo_mini_batch_size=mini_batch, rollout_n=n, max_ppo_update_times=cap, rng=random.Random(seed)
    )

    m = mini_batch * n
    assert len(result.keep) % m == 0
    assert len(result.keep) == kept_row_count(len(uids), m, cap)
    assert result.n_dropped_same_reward + result.n_dropped_random == len(uids) - len(result.keep)
    assert result.keep == sorted(set(result.keep))
    same = same_reward_rows(uids, rewards)
    dropped = set(range(len(uids))) - set(result.keep)
    if any(not same[i] for i in dropped):  # a varying-reward row went: no same-reward row may remain
        assert all(not same[i] for i in result.keep)
