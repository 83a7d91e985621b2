"""per_rollout_mean inside verl: registration, and agreement with verl's standard loss."""

from __future__ import annotations

import pytest
import torch

from agl_train.algo.loss import normalize_advantages_by_rollout
from agl_train.verl_glue._verl import core_algos, get_policy_loss_fn
from agl_train.verl_glue.verl_loss import compute_policy_loss_per_rollout_mean, register_per_rollout_loss


@pytest.fixture
def actor_config():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from verl.workers.config import ActorConfig

    return ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1, clip_ratio_high=0.28)


def test_registration_makes_verl_find_the_loss_and_may_be_repeated() -> None:
    register_per_rollout_loss()
    register_per_rollout_loss()

    assert get_policy_loss_fn("per_rollout_mean") is compute_policy_loss_per_rollout_mean


def test_another_function_under_the_same_name_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "per_rollout_mean", core_algos.compute_policy_loss_vanilla)

    with pytest.raises(ValueError, match="already registered"):
        register_per_rollout_loss()


def test_with_one_row_per_rollout_it_reduces_to_verls_vanilla_loss_averaged_per_sequence(actor_config) -> None:
    """Σ_b Σ_t m·L(A / (T_b · N)) = (1/N) Σ_b (1/T_b) Σ_t m·L(A): verl's seq-mean-token-mean."""
    generator = torch.Generator().manual_seed(0)
    n_rows, width = 6, 9
    lengths = torch.randint(1, width + 1, (n_rows,), generator=generator)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).long()
    old = -torch.rand(n_rows, width, generator=generator)
    new = old + 0.6 * (torch.rand(n_rows, width, generator=generator) - 0.5)  # some ratios clip
    advantages = torch.randn(n_rows, 1, generator=generator) * mask
    weights = torch.rand(n_rows, width, generator=generator) + 0.5
    rollout_ids = [f"ro-{i}" for i in range(n_rows)]

    ours, ours_metrics = compute_policy_loss_per_rollout_mean(
        old,
        new,
        normalize_advantages_by_rollout(advantages, mask, rollout_ids),
        mask,
        config=actor_config,
        rollout_is_weights=weights,
    )
    verl, verl_metrics = core_algos.compute_policy_loss_vanilla(
        old, new, advantages, mask, loss_agg_mode="seq-mean-token-mean", config=actor_config, rollout_is_weights=weights
    )

    torch.testing.assert_close(ours, verl)
    assert ours_metrics == pytest.approx(verl_metrics)


def test_the_dp_size_comes_from_verls_global_batch_info(actor_config) -> None:
    mask = torch.ones(2, 3, dtype=torch.long)
    zeros = torch.zeros(2, 3)
    advantages = torch.full((2, 3), 0.25)

    single, _ = compute_policy_loss_per_rollout_mean(zeros, zeros, advantages, mask, config=actor_config)
    actor_config.global_batch_info["dp_size"] = 4
    sharded, _ = compute_policy_loss_per_rollout_mean(zeros, zeros, advantages, mask, config=actor_config)

    assert float(single) == pytest.approx(-1.5)
    assert float(sharded) == pytest.approx(4 * -1.5)
