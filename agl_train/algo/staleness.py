"""How stale a step's trained tokens are, and the optional bound that masks the stalest
(docs/trainer.md, "Staleness and off-policy correction").

A trained token's age is the trained weight version minus the version that sampled it:
a = v_train − v_sample[b, t], 0 for a token sampled by the weights being updated. Async
rollout carries groups over between updates, so their tokens are older. All tensors are
`[B, R]`; `versions` holds `tensorize.UNKNOWN_VERSION` where the version is not known, and a
token is trained where `response_mask` is 1.
"""

from __future__ import annotations

import torch

from .tensorize import UNKNOWN_VERSION

PREFIX = "training/off_policy"


def staleness_metrics(versions: torch.Tensor, response_mask: torch.Tensor, trained_version: int) -> dict[str, float]:
    """The staleness of the trained tokens, with T the trained tokens and K ⊆ T those whose
    version is known:

    - `version_coverage` = |K| / |T| (1.0 when T is empty);
    - `token_staleness/mean` = Σ_K a / |K|, `token_staleness/max` = max_K a (0 when K is empty);
    - `cross_version_row_fraction`: the share of rows with a token in K whose K-tokens come from
      more than one version; `cross_version_token_fraction`: the share of K in those rows;
    - verl's per-row names, over the rows with a token in K (verl's fully async trainer):
      `trajectory_staleness/*` = v_train − max v (the freshest weights of the row),
      `trajectory_staleness_worst/*` = v_train − min v, `trajectory_spans/*` = max v − min v + 1,
      each as `mean`, `max`, `min`.

    Every name is under `training/off_policy/`.
    """
    trained = response_mask.bool()
    known = trained & (versions != UNKNOWN_VERSION)
    n_trained, n_known = int(trained.sum()), int(known.sum())
    metrics = {f"{PREFIX}/version_coverage": n_known / n_trained if n_trained else 1.0}
    ages = (trained_version - versions).to(torch.float64)
    metrics[f"{PREFIX}/token_staleness/mean"] = float(ages[known].mean()) if n_known else 0.0
    metrics[f"{PREFIX}/token_staleness/max"] = float(ages[known].max()) if n_known else 0.0

    rows = known.any(dim=-1)
    newest = versions.masked_fill(~known, torch.iinfo(versions.dtype).min).amax(dim=-1)[rows]
    oldest = versions.masked_fill(~known, torch.iinfo(versions.dtype).max).amin(dim=-1)[rows]
    crossing = newest != oldest
    n_rows = int(rows.sum())
    metrics[f"{PREFIX}/cross_version_row_fraction"] = float(crossing.sum()) / n_rows if n_rows else 0.0
    tokens_per_row = known.sum(dim=-1)[rows]
    metrics[f"{PREFIX}/cross_version_token_fraction"] = (
        float(tokens_per_row[crossing].sum()) / n_known if n_known else 0.0
    )
    per_row = {
        "trajectory_staleness": trained_version - newest,
        "trajectory_staleness_worst": trained_version - oldest,
        "trajectory_spans": newest - oldest + 1,
    }
    for name, values in per_row.items():
        values = values.to(torch.float64)
        for stat, reduce in (("mean", torch.mean), ("max", torch.amax), ("min", torch.amin)):
            metrics[f"{PREFIX}/{name}/{stat}"] = float(reduce(values)) if n_rows else 0.0
    return metrics


def mask_stale_tokens(
    versions: torch.Tensor, response_mask: torch.Tensor, trained_version: int, max_staleness: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """`response_mask` without the trained tokens older than `max_staleness` versions:
    m'[b, t] = m[b, t] · [v_sample[b, t] unknown or v_train − v_sample[b, t] ≤ K].

    A token whose version is not known is kept (`version_coverage` says how many there are).
    Returns the new mask (the dtype of `response_mask`) and `training/off_policy/n_tokens_masked_stale`,
    `training/off_policy/stale_masked_fraction` (masked / trained tokens).
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    trained = response_mask.bool()
    stale = trained & (versions != UNKNOWN_VERSION) & (trained_version - versions > max_staleness)
    n_trained, n_stale = int(trained.sum()), int(stale.sum())
    metrics = {
        f"{PREFIX}/n_tokens_masked_stale": float(n_stale),
        f"{PREFIX}/stale_masked_fraction": n_stale / n_trained if n_trained else 0.0,
    }
    return response_mask.masked_fill(stale, 0), metrics


__all__ = ["PREFIX", "mask_stale_tokens", "staleness_metrics"]
