"""Rollout-level advantage, the pure parts: grouping rows by rollout, scalars, broadcast."""

from __future__ import annotations

import pytest
import torch

from agl_train.algo.advantage import broadcast_to_rows, index_rollouts, rollout_scalars
from agl_train.core.aggregate import Limits, aggregate
from agl_train.core.traces import trace_from_spans

from .builders import llm_call_span, reward


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


def test_a_rollout_whose_first_call_was_retried_has_a_representative_that_trains_tokens() -> None:
    # The agent threw its first answer away and asked again; `superseded: mask` keeps that answer's row.
    first = llm_call_span([1, 2], [10], sequence_id=1, span_id="A", chain={"prompt": "rendered", "cause": "first_call"})
    again = llm_call_span([1, 2], [11], sequence_id=2, span_id="A2", chain={"prompt": "retry", "parent": "A"})
    trace = trace_from_spans("ro-1", [first, again, reward(1.0)])
    rows = aggregate([trace], "trajectory", Limits(8, 8), superseded="mask").rows
    masks = torch.tensor([list(row.response_mask) for row in rows])

    index = index_rollouts([row.rollout_id for row in rows], ["g"] * len(rows), [row.reward for row in rows])
    representatives = masks[index.representatives]
    assert rollout_scalars(0.5 * representatives, representatives).tolist() == [0.5]
    assert masks.tolist() == [[1], [0]]
