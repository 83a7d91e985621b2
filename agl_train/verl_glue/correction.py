"""verl's rollout correction (`algorithm.rollout_correction`) on agl's update batch
(docs/trainer.md, "Staleness and off-policy correction").

The rollouts' tokens were sampled by vLLM, maybe several weight versions ago (async rollout),
and always with other numerics than the actor's; the proxy records their sampling log-probs
(`rollout_log_probs`). After the old log-probs, the step runs verl's own decoupled-mode
correction, as verl's loop does (`compute_rollout_correction_and_add_to_batch`), with
log r = log π_old − log π_rollout per token:

- `rollout_is` (`token` | `sequence`): importance weights w = exp(log r) per token, or
  exp(Σ_t log r) per row, truncated at `rollout_is_threshold` (TIS: min(w, C)), or zero outside
  `"lower_upper"` (IcePop), optionally divided by their batch mean (`rollout_is_batch_normalize`);
  they go to the loss as `rollout_is_weights` (`loss.per_rollout_mean_loss`: Σ m·w·L);
- `rollout_rs` (`token_k1`, `seq_mean_k3`, ...; comma-separated, all must pass) with
  `rollout_rs_threshold`: rejected tokens (or rows) leave `response_mask`, so they are not trained
  and the other tokens keep their weights;
- verl's metrics `rollout_corr/*` (`rollout_is_mean`, `rollout_is_ratio_fraction_high`: the share
  truncated, `rollout_rs_masked_fraction`, `kl`, `chi2_token`, ...), on every step whose rows all
  have sampling log-probs, as verl's loop logs them.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ._verl import DataProto, compute_rollout_correction_and_add_to_batch

logger = logging.getLogger(__name__)

CORRECTION_KEY = "algorithm.rollout_correction"
METRIC_SKIPPED = "rollout_corr/skipped_without_log_probs"
"""1 on a step whose correction did not run: a row had no sampling log-probs."""


def corrects(correction: Any) -> bool:
    """Whether `algorithm.rollout_correction` asks for weights or rejection (not only metrics)."""
    return correction is not None and (
        correction.get("rollout_is") is not None or correction.get("rollout_rs") is not None
    )


def check_rollout_correction(algorithm: Any) -> None:
    """ValueError naming `algorithm.rollout_correction` when verl would refuse its settings (an
    unknown `rollout_is` level or `rollout_rs` option, a bad threshold, rejection without a
    threshold): verl's own checks, run now on a one-row batch rather than after a step of rollouts."""
    correction = algorithm.get("rollout_correction")
    if not corrects(correction):
        return
    one = torch.zeros(1, 2)
    probe = DataProto.from_dict(tensors={"old_log_probs": one, "rollout_log_probs": one, "response_mask": one + 1})
    try:
        compute_rollout_correction_and_add_to_batch(probe, correction)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{CORRECTION_KEY} is not one verl can apply: {exc}") from exc


def apply_rollout_correction(batch: DataProto, algorithm: Any) -> tuple[DataProto, dict[str, float]]:
    """`batch` (with `old_log_probs`) corrected as `algorithm.rollout_correction` says (see the
    module docstring), and verl's `rollout_corr/*` metrics. Without `rollout_log_probs` (a row
    whose calls did not all record log-probs) nothing is corrected: a warning when correction was
    asked for, and `rollout_corr/skipped_without_log_probs` 1."""
    correction = algorithm.get("rollout_correction")
    if correction is None:
        return batch, {}
    if "rollout_log_probs" not in batch.batch:
        if corrects(correction):
            logger.warning(
                "%s is set but a row of this step has no sampling log-probs (a call without logprobs): "
                "the update is not corrected",
                CORRECTION_KEY,
            )
        return batch, {METRIC_SKIPPED: 1.0}
    batch, metrics = compute_rollout_correction_and_add_to_batch(batch, correction)
    return batch, {**{key: float(value) for key, value in metrics.items()}, METRIC_SKIPPED: 0.0}


__all__ = ["CORRECTION_KEY", "METRIC_SKIPPED", "apply_rollout_correction", "check_rollout_correction", "corrects"]
