"""Rollout-level advantage, the pure parts: grouping rows by rollout, scalars, broadcast."""

from __future__ import annotations

import pytest
import torch

from agl_train.algo.advantage import broadcast_to_rows, index_rollouts, rollout_scalars


def test_each_rollout_is_represented_by_its_first_row() -> None:
    index = index_rollouts(["ro-a", "ro-b", "ro-a", "ro-a"], ["g", "g", "g", "g"], [1.0, 0.0, 1.0, 1.0])

    assert index.rollout_ids == ["ro-a", "ro-b"]
    assert index.representatives == [0, 1]
    assert index.row_to_rollout.tolist() == [0, 1, 0, 0]


def test_rows_of_one_rollout_must_share_uid_and_reward() -> None:
    with pytest.raises(ValueError, match="two groups"):
        index_rollouts(["ro-a", "ro-a"], ["g1", "g2"], [1.0, 1.0])
    with pytest.raises(ValueError, match="different rewards"):
        index_rollouts(["ro-a", "ro-a"], ["g", "g"], [1.0, 0.5])


def test_the_scalar_of_an_outcome_advantage_is_read_where_the_mask_is_set() -> None:
    advantages = torch.tensor([[0.0, 0.7, 0.7], [-0.7, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1], [1, 0, 0]])

    assert rollout_scalars(advantages, mask).tolist() == pytest.approx([0.7, -0.7])


def test_an_advantage_that_varies_along_the_row_has_no_rollout_scalar() -> None:
    with pytest.raises(ValueError, match="outcome estimator"):
        rollout_scalars(torch.tensor([[0.5, 0.25]]), torch.tensor([[1, 1]]))


def test_broadcast_puts_each_rollout_scalar_on_the_generated_tokens_of_all_its_rows() -> None:
    index = index_rollouts(["ro-a", "ro-b", "ro-a"], ["g", "g", "g"], [1.0, 0.0, 1.0])
    mask = torch.tensor([[1, 0, 1], [1, 1, 0], [1, 1, 1]])

    advantages = broadcast_to_rows(torch.tensor([2.0, -3.0]), index, mask)

    assert advantages.tolist() == [[2.0, 0.0, 2.0], [-3.0, -3.0, 0.0], [2.0, 2.0, 2.0]]
