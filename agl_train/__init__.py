"""agl_train: from token-level spans to verl training rows, advantages and losses.

The names below are loaded on first use: `agl store serve` imports `agl_train.view`
through an entry point and must not pay for torch. They need only torch; verl's glue
lives in `agl_train.verl_batch` (DataProto, rollout-level advantage through verl, update
batch), `agl_train.verl_loss` (`per_rollout_mean` in verl's registry) and `agl_train.step`
(one step's data path); import those explicitly, and the aggregator itself as
`from agl_train.aggregate import aggregate` (the module shares its name). See docs/training.md.
"""

from __future__ import annotations

from types import MappingProxyType

from ._lazy import lazy_exports

_EXPORTS = MappingProxyType(
    {
        **dict.fromkeys(["RolloutIndex", "broadcast_to_rows", "index_rollouts", "rollout_scalars"], "advantage"),
        **dict.fromkeys(
            [
                "LEVEL_TRAJECTORY",
                "LEVEL_TRANSITION",
                "METRIC_DROPPED_MARKED",
                "METRIC_TRUNCATED",
                "Aggregation",
                "Limits",
                "Row",
                "get_aggregator",
                "limits_for_level",
            ],
            "aggregate",
        ),
        **dict.fromkeys(["LOSS_MODE", "normalize_advantages_by_rollout", "per_rollout_mean_loss"], "loss"),
        **dict.fromkeys(["BREAK_KINDS", "PrefixBreak", "classify_break"], "prefix_break"),
        **dict.fromkeys(
            ["LLMCall", "RolloutTrace", "calls_from_spans", "final_reward", "read_rollout", "trace_from_spans"],
            "traces",
        ),
        **dict.fromkeys(["rows_to_non_tensors", "rows_to_tensors"], "tensorize"),
        **dict.fromkeys(
            ["METRIC_DROPPED_RANDOM", "METRIC_DROPPED_SAME_REWARD", "UpdateCap", "cap_updates"], "update_cap"
        ),
    }
)

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
