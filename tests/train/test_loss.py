"""per_rollout_mean, the pure math: advantage normalisation by rollout and the dual-clip loss."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_train.algo.loss import clipped_policy_losses, normalize_advantages_by_rollout, per_rollout_mean_loss


def test_each_row_is_divided_by_its_rollouts_tokens_times_the_row_count() -> None:
    # ro-a: rows with 2 and 1 valid tokens (T = 3); ro-b: one row with 2 (T = 2); N = 3 rows.
    advantages = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [-2.0, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0]])

    normalized = normalize_advantages_by_rollout(advantages, mask, ["ro-a", "ro-a", "ro-b"])

    expected = torch.tensor([[1 / 9, 1 / 9, 0.0], [1 / 9, 0.0, 0.0], [-2 / 6, -2 / 6, 0.0]])
    torch.testing.assert_close(normalized, expected)


def test_the_dual_clip_bounds_the_loss_of_negative_advantages() -> None:
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.5, 0.5, 5.0, 1.0]]))
    advantages = torch.tensor([[1.0, -1.0, -1.0, 2.0]])

    losses, clipped, dual = clipped_policy_losses(old, new, advantages, 0.2, 0.2, 3.0)

    # ρ = 1.5, A = 1: max(-1.5, -1.2) = -1.2.  ρ = 0.5, A = -1: max(0.5, 0.8) = 0.8.
    # ρ = 5, A = -1: max(5, 1.2) = 5, dual clip min(5, 3) = 3.  ρ = 1, A = 2: -2.
    torch.testing.assert_close(losses, torch.tensor([[-1.2, 0.8, 3.0, -2.0]]))
    assert clipped.tolist() == [[True, True, False, False]]
    assert dual.tolist() == [[False, False, True, False]]


def test_the_loss_is_a_masked_sum_times_dp_size_with_optional_is_weights() -> None:
    old = torch.zeros(2, 2)
    advantages = torch.tensor([[0.5, 0.5], [-0.25, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])

    loss, metrics = per_rollout_mean_loss(old, old, advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert float(loss) == pytest.approx(-0.5 - 0.5 + 0.25)
    assert metrics == {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": 0.0, "actor/pg_clipfrac_lower": 0.0}

    weights = torch.tensor([[2.0, 1.0], [1.0, 1.0]])
    loss, _ = per_rollout_mean_loss(
        old, old, advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, rollout_is_weights=weights, dp_size=4
    )
    assert float(loss) == pytest.approx(4 * (-1.0 - 0.5 + 0.25))


def test_clip_ratio_c_must_exceed_one() -> None:
    with pytest.raises(ValueError, match="clip_ratio_c"):
        clipped_policy_losses(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), 0.2, 0.2, 1.0)


@settings(max_examples=200, deadline=None)
@given(
    rollouts=st.lists(
        st.tuples(
            st.floats(-2, 2, allow_nan=False),
            st.lists(st.integers(1, 5), min_size=1, max_size=4),  # valid tokens of each row
            st.lists(st.integers(1, 5), min_size=1, max_size=4),  # another split into rows
        ),
        min_size=1,
        max_size=5,
    )
)
def test_a_rollouts_total_weight_does_not_depend_on_how_many_rows_it_was_split_into(rollouts) -> None:
    """Σ over a rollout's rows and tokens of Â equals a_r / N for any split into rows."""

    def total_weights(split: int) -> list[float]:
        width = 6
        advantages, masks, ids = [], [], []
        for r, (a, first, second) in enumerate(rollouts):
            for n_tokens in (first, second)[split]:
                masks.append([1] * n_tokens + [0] * (width - n_tokens))
                advantages.append([a * m for m in masks[-1]])
                ids.append(f"ro-{r}")
        normalized = normalize_advantages_by_rollout(
            torch.tensor(advantages, dtype=torch.float64), torch.tensor(masks), ids
        )
        n_rows = len(ids)
        per_rollout = [0.0] * len(rollouts)
        for row, rollout in enumerate(ids):
            per_rollout[int(rollout[3:])] += float(normalized[row].sum()) * n_rows
        return per_rollout

    expected = [a for a, _, _ in rollouts]
    assert total_weights(0) == pytest.approx(expected, abs=1e-9)
    assert total_weights(1) == pytest.approx(expected, abs=1e-9)


def test_the_vectorised_normalisation_matches_a_plain_loop() -> None:
    generator = torch.Generator().manual_seed(3)
    n_rows, width = 12, 7
    advantages = torch.randn(n_rows, width, generator=generator, dtype=torch.float64)
    mask = (torch.rand(n_rows, width, generator=generator) > 0.3).long()
    rollout_ids = [f"ro-{int(i)}" for i in torch.randint(0, 4, (n_rows,), generator=generator)]

    tokens = {}
    for row, rollout in enumerate(rollout_ids):
        tokens[rollout] = tokens.get(rollout, 0) + int(mask[row].sum())
    expected = torch.zeros_like(advantages)
    for row, rollout in enumerate(rollout_ids):
        for t in range(width):
            if tokens[rollout]:
                expected[row, t] = advantages[row, t] / (tokens[rollout] * n_rows)

    torch.testing.assert_close(normalize_advantages_by_rollout(advantages, mask, rollout_ids), expected)


def test_the_vectorised_dual_clip_matches_a_plain_loop() -> None:
    import math

    generator = torch.Generator().manual_seed(4)
    old = -torch.rand(5, 6, generator=generator, dtype=torch.float64)
    new = old + torch.randn(5, 6, generator=generator, dtype=torch.float64)
    advantages = torch.randn(5, 6, generator=generator, dtype=torch.float64)
    low, high, c = 0.2, 0.28, 3.0

    expected = torch.zeros_like(advantages)
    for b in range(5):
        for t in range(6):
            a = float(advantages[b, t])
            ratio = math.exp(max(-20.0, min(20.0, float(new[b, t] - old[b, t]))))
            loss = max(-a * ratio, -a * min(max(ratio, 1 - low), 1 + high))
            expected[b, t] = min(loss, -a * c) if a < 0 else loss

    losses, _, _ = clipped_policy_losses(old, new, advantages, low, high, c)
    torch.testing.assert_close(losses, expected)


def test_the_loss_backpropagates_and_its_metrics_are_plain_numbers() -> None:
    # As in training: log_prob comes out of the model and requires grad (pytest turns warnings into errors).
    log_prob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, metrics = per_rollout_mean_loss(
        torch.tensor([[-1.5, -2.0]]), log_prob, torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 1.0]]),
        clip_ratio_low=0.2, clip_ratio_high=0.2,
    )  # fmt: skip
    loss.backward()
    assert log_prob.grad is not None and all(isinstance(value, float) for value in metrics.values())
