"""The staleness of a step's trained tokens, and the bound that masks the stalest."""

from __future__ import annotations

import pytest
import torch

from agl_train.algo.staleness import mask_stale_tokens, staleness_metrics
from agl_train.algo.tensorize import SAMPLING_VERSIONS, rows_to_tensors
from agl_train.core.aggregate import Limits, aggregate
from agl_train.core.traces import trace_from_spans
from agl_train.verl_glue._verl import DataProto
from agl_train.verl_glue.step import off_policy

from .test_versions import crossing_spans

U = -1  # tensorize.UNKNOWN_VERSION
# Trained at version 4. Row 0 crossed an update (3, then 4) and has an inserted token; row 1 was
# sampled two updates ago; row 2's first two trained tokens come from a call without a version.
VERSIONS = torch.tensor([[3, 3, U, 4, U], [2, 2, 2, U, U], [U, U, 4, 4, U]])
MASK = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]])


def test_the_age_of_the_trained_tokens_weighted_by_token_and_by_row() -> None:
    metrics = staleness_metrics(VERSIONS, MASK, trained_version=4)

    assert metrics == pytest.approx(
        {
            "training/off_policy/version_coverage": 7 / 9,  # 9 trained tokens, 2 of unknown version
            "training/off_policy/token_staleness/mean": (1 + 1 + 0 + 2 + 2 + 2 + 0) / 7,
            "training/off_policy/token_staleness/max": 2.0,
            "training/off_policy/cross_version_row_fraction": 1 / 3,  # row 0
            "training/off_policy/cross_version_token_fraction": 3 / 7,
            # verl's per-row names: the age of the row's freshest weights, of its oldest, and how many versions it spans
            "training/off_policy/trajectory_staleness/mean": (0 + 2 + 0) / 3,
            "training/off_policy/trajectory_staleness/max": 2.0,
            "training/off_policy/trajectory_staleness/min": 0.0,
            "training/off_policy/trajectory_staleness_worst/mean": (1 + 2 + 0) / 3,
            "training/off_policy/trajectory_staleness_worst/max": 2.0,
            "training/off_policy/trajectory_staleness_worst/min": 0.0,
            "training/off_policy/trajectory_spans/mean": (2 + 1 + 1) / 3,
            "training/off_policy/trajectory_spans/max": 2.0,
            "training/off_policy/trajectory_spans/min": 1.0,
        }
    )


def test_a_batch_of_unknown_versions_has_no_coverage_and_no_age() -> None:
    metrics = staleness_metrics(torch.full((1, 3), U), torch.tensor([[1, 1, 0]]), trained_version=4)
    assert metrics["training/off_policy/version_coverage"] == 0.0
    assert metrics["training/off_policy/token_staleness/max"] == 0.0
    assert metrics["training/off_policy/trajectory_spans/mean"] == 0.0


@pytest.mark.parametrize(
    "bound, mask, masked",
    [
        (2, MASK.tolist(), 0),
        (1, [[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 0, 0]], 3),  # row 1 is two versions old
        (0, [[0, 0, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 0, 0]], 5),  # unknown versions are kept
    ],
)
def test_the_bound_masks_trained_tokens_older_than_it(bound, mask, masked) -> None:
    new_mask, metrics = mask_stale_tokens(VERSIONS, MASK, trained_version=4, max_staleness=bound)

    assert new_mask.tolist() == mask and new_mask.dtype == MASK.dtype
    assert metrics == pytest.approx(
        {"training/off_policy/n_tokens_masked_stale": masked, "training/off_policy/stale_masked_fraction": masked / 9}
    )


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        mask_stale_tokens(VERSIONS, MASK, trained_version=4, max_staleness=-1)


def batch() -> DataProto:
    return DataProto.from_dict(tensors={"response_mask": MASK.clone(), SAMPLING_VERSIONS: VERSIONS.clone()})


def test_the_step_measures_the_update_masks_its_stale_tokens_and_drops_the_versions() -> None:
    data, metrics = off_policy(batch(), trained_version=4, max_staleness=1)

    assert data is not None and SAMPLING_VERSIONS not in data.batch.keys()  # verl's update never sees them
    assert data.batch["response_mask"][1].sum() == 0
    assert metrics["training/off_policy/token_staleness/max"] == 2.0  # measured before the bound
    assert metrics["training/off_policy/n_tokens_masked_stale"] == 3.0


def test_a_step_whose_every_trained_token_is_too_old_trains_nothing(caplog) -> None:
    data = DataProto.from_dict(tensors={"response_mask": MASK[1:2].clone(), SAMPLING_VERSIONS: VERSIONS[1:2].clone()})

    kept, metrics = off_policy(data, trained_version=4, max_staleness=1)

    assert kept is None and metrics["training/off_policy/stale_masked_fraction"] == 1.0
    assert "agentlightning.max_token_staleness" in caplog.text


def test_without_a_trained_version_the_step_only_drops_the_versions() -> None:
    data, metrics = off_policy(batch(), trained_version=None, max_staleness=1)
    assert data is not None and metrics == {} and SAMPLING_VERSIONS not in data.batch.keys()
    assert torch.equal(data.batch["response_mask"], MASK)


def test_a_response_sampled_across_an_update_counts_as_crossing_versions() -> None:
    first, _, end = crossing_spans()  # the crossing answer alone
    rows = aggregate([trace_from_spans("ro-1", [first, end])], "trajectory", Limits(8, 12)).rows
    tensors = rows_to_tensors(rows, Limits(8, 12), pad_token_id=0)

    metrics = staleness_metrics(tensors[SAMPLING_VERSIONS], tensors["response_mask"], trained_version=4)

    assert metrics == pytest.approx(
        {
            "training/off_policy/version_coverage": 1.0,
            "training/off_policy/token_staleness/mean": 5 / 12,  # 5 tokens one version old, 7 current
            "training/off_policy/token_staleness/max": 1.0,
            "training/off_policy/cross_version_row_fraction": 1.0,
            "training/off_policy/cross_version_token_fraction": 1.0,
            "training/off_policy/trajectory_staleness/mean": 0.0,
            "training/off_policy/trajectory_staleness/max": 0.0,
            "training/off_policy/trajectory_staleness/min": 0.0,
            "training/off_policy/trajectory_staleness_worst/mean": 1.0,
            "training/off_policy/trajectory_staleness_worst/max": 1.0,
            "training/off_policy/trajectory_staleness_worst/min": 1.0,
            "training/off_policy/trajectory_spans/mean": 2.0,
            "training/off_policy/trajectory_spans/max": 2.0,
            "training/off_policy/trajectory_spans/min": 2.0,
        }
    )
