"""verl's `algorithm.rollout_correction` accepted, checked and applied to agl's update batch."""

from __future__ import annotations

import math

import pytest
import torch

from agl_train.algo.loss import per_rollout_mean_loss
from agl_train.verl_glue._verl import DataProto
from agl_train.verl_glue.config import compose_config, trainer_settings
from agl_train.verl_glue.correction import METRIC_SKIPPED, apply_rollout_correction, check_rollout_correction

KEY = "algorithm.rollout_correction"
# π_old / π_rollout per token: row 0 has one ratio over the truncation bound 2 and one under 1/2.
RATIOS = torch.tensor([[1.5, 3.0, 0.5], [1.0, 1.0, 1.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def algorithm(*overrides: str):
    return compose_config([f"{KEY}.{override}" for override in overrides]).algorithm


def batch(with_rollout_log_probs: bool = True) -> DataProto:
    rollout = torch.full_like(RATIOS, -1.0)
    tensors = {"old_log_probs": rollout + RATIOS.log(), "response_mask": MASK.clone()}
    if with_rollout_log_probs:
        tensors["rollout_log_probs"] = rollout
    return DataProto.from_dict(tensors=tensors)


def test_importance_sampling_and_rejection_are_accepted_bypass_mode_says_why_not() -> None:
    trainer_settings(
        compose_config(
            [f"{KEY}.rollout_is=sequence", f"{KEY}.rollout_rs=seq_mean_k3", f"{KEY}.rollout_rs_threshold=0.01"]
        )
    )
    with pytest.raises(ValueError, match=r"bypass_mode=true .*replaces .*per_rollout_mean loss"):
        trainer_settings(compose_config([f"{KEY}.bypass_mode=true"]))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout_is=tokens"], "Invalid rollout_is: tokens"),
        (["rollout_rs=token_k1"], "rollout_rs_threshold must be"),
        (["rollout_rs=token_k9", "rollout_rs_threshold=2.0"], "Invalid rollout_rs option: token_k9"),
        (["rollout_is=token", "rollout_is_threshold=-1"], "upper bound must be positive"),
    ],
)
def test_settings_verl_would_refuse_at_the_first_step_are_refused_now(overrides, message) -> None:
    with pytest.raises(ValueError, match=rf"{KEY} is not one verl can apply: .*{message}"):
        check_rollout_correction(algorithm(*overrides))
    check_rollout_correction(algorithm("rollout_is=token", "rollout_is_threshold=2.0"))


def test_token_level_truncated_importance_weights_go_to_the_batch() -> None:
    corrected, metrics = apply_rollout_correction(batch(), algorithm("rollout_is=token", "rollout_is_threshold=2.0"))

    # w = min(π_old / π_rollout, 2) on response tokens, 0 elsewhere
    torch.testing.assert_close(corrected.batch["rollout_is_weights"], torch.tensor([[1.5, 2.0, 0.5], [1.0, 1.0, 0.0]]))
    assert torch.equal(corrected.batch["response_mask"], MASK)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((1.5 + 2.0 + 0.5 + 1.0 + 1.0) / 5)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)  # the share truncated
    assert metrics["rollout_corr/kl"] == pytest.approx(-sum(math.log(r) for r in (1.5, 3.0, 0.5, 1.0, 1.0)) / 5)
    assert metrics[METRIC_SKIPPED] == 0.0


def test_sequence_level_weights_are_the_product_of_the_rows_ratios_truncated() -> None:
    corrected, _ = apply_rollout_correction(batch(), algorithm("rollout_is=sequence", "rollout_is_threshold=5.0"))
    torch.testing.assert_close(
        corrected.batch["rollout_is_weights"], torch.tensor([[2.25, 2.25, 2.25], [1.0, 1.0, 0.0]])
    )


def test_rejection_takes_the_tokens_out_of_the_response_mask() -> None:
    # token_k1 keeps a token whose ratio lies in [1/1.8, 1/0.6]: 3.0 and 0.5 are rejected
    corrected, metrics = apply_rollout_correction(
        batch(), algorithm("rollout_rs=token_k1", "rollout_rs_threshold=0.6_1.8")
    )

    assert corrected.batch["response_mask"].tolist() == [[1, 0, 0], [1, 1, 0]]
    assert "rollout_is_weights" not in corrected.batch.keys()
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)


def test_the_weights_scale_each_tokens_term_of_agls_loss() -> None:
    corrected, _ = apply_rollout_correction(batch(), algorithm("rollout_is=token", "rollout_is_threshold=2.0"))
    weights = corrected.batch["rollout_is_weights"]
    log_prob = corrected.batch["old_log_probs"]
    advantages = torch.tensor([[0.1, 0.2, 0.3], [-0.1, -0.2, -0.3]])

    loss, _ = per_rollout_mean_loss(
        log_prob, log_prob, advantages, MASK, clip_ratio_low=0.2, clip_ratio_high=0.2, rollout_is_weights=weights
    )

    # ratio 1: each token's term is -A, scaled by its weight
    assert float(loss) == pytest.approx(float(-(advantages * weights * MASK).sum()))


def test_a_step_without_sampling_log_probs_is_not_corrected_and_says_so(caplog) -> None:
    data = batch(with_rollout_log_probs=False)

    corrected, metrics = apply_rollout_correction(data, algorithm("rollout_is=token"))

    assert corrected is data and metrics == {METRIC_SKIPPED: 1.0}
    assert "no sampling log-probs" in caplog.text
