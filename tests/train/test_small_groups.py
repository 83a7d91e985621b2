"""A group with fewer than two trainable rollouts has no advantage: a lone survivor of a group
whose other rollouts failed is not pushed up (or down) by its raw reward."""

from __future__ import annotations

import random

import pytest
import torch

from agl_train.algo.advantage import small_group_advantage
from agl_train.verl_glue.step import build_batch, prepare_update
from agl_train.verl_glue.verl_batch import compute_rollout_level_advantage

from .builders import call, trace
from .builders import train_settings as settings


def lone_survivor_and_a_pair():
    """q1: only ro-a (reward 0.9) succeeded, its peer failed; q2: ro-b (1) and ro-c (0)."""
    return [
        trace("ro-a", [call([1, 2], [3])], reward_value=0.9, uid="q1"),
        trace("ro-b", [call([1, 7], [8])], reward_value=1.0, uid="q2"),
        trace("ro-c", [call([1, 7], [9])], reward_value=0.0, uid="q2"),
    ]


def first_advantages(data) -> dict[str, float]:
    return {
        rollout_id: float(advantages[0])
        for rollout_id, advantages in zip(data.non_tensor_batch["rollout_id"], data.batch["advantages"], strict=False)
    }


def with_rewards(data):
    data.batch["token_level_rewards"] = data.batch["token_level_scores"].clone()
    return data


def test_a_lone_survivor_gets_advantage_zero_and_the_pair_keeps_grpos() -> None:
    data, _ = build_batch(lone_survivor_and_a_pair(), settings(), pad_token_id=0)

    advantages = first_advantages(compute_rollout_level_advantage(with_rewards(data), "grpo"))

    assert advantages["ro-a"] == 0.0  # verl alone would give its raw reward, +0.9
    assert advantages["ro-b"] == pytest.approx(0.5**0.5, abs=1e-5)
    assert advantages["ro-c"] == pytest.approx(-(0.5**0.5), abs=1e-5)


def test_each_step_counts_its_small_groups() -> None:
    s = settings()
    data, _ = build_batch(lone_survivor_and_a_pair(), s, pad_token_id=0)

    _, metrics = prepare_update(with_rewards(data), s, rng=random.Random(0), adv_estimator="grpo")

    assert metrics["training/n_small_groups"] == 1.0


def test_the_rule_itself() -> None:
    scalars = torch.tensor([0.9, 0.7, -0.7, 0.3])
    zeroed, small = small_group_advantage(scalars, ["q1", "q2", "q2", "q3"])
    assert zeroed.tolist() == pytest.approx([0.0, 0.7, -0.7, 0.0]) and small == 2
