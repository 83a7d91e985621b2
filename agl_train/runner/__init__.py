"""Rollout execution for the trainer: local subprocesses, Kubernetes Jobs, the dispatcher that
feeds them from the store's queue, and the prompt groups a step trains on.

The names below are loaded on first use: every rollout process runs
`python -m agl_train.runner.launch`, which must not pay for the store's client and models
(seconds of CPU per rollout on a busy machine)."""

from __future__ import annotations

from types import MappingProxyType

from .._lazy import lazy_exports

_EXPORTS = MappingProxyType(
    {
        **dict.fromkeys(["RolloutDispatcher", "Runner"], "dispatch"),
        **dict.fromkeys(["MissingInputField", "RolloutEndpoints"], "env"),
        **dict.fromkeys(["Collected", "Group", "GroupTracker"], "groups"),
        "LocalRunner": "local",
        **dict.fromkeys(["RolloutOutcome", "record_outcome"], "outcome"),
        "RunnerSettings": "runner_settings",
    }
)

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
