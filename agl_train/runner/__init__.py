"""Rollout execution for the trainer: local subprocesses, Kubernetes Jobs, the dispatcher that
feeds them from the store's queue, and the prompt groups a step trains on.

The names below are loaded on first use: every rollout process runs
`python -m agl_train.runner.launch`, which must not pay for the store's client and models
(seconds of CPU per rollout on a busy machine)."""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Any

_EXPORTS = MappingProxyType(
    {
        **dict.fromkeys(["RolloutDispatcher", "Runner"], "dispatch"),
        **dict.fromkeys(["MissingInputField", "RolloutEndpoints"], "env"),
        **dict.fromkeys(["Collected", "Group", "GroupTracker"], "groups"),
        "LocalRunner": "local",
        **dict.fromkeys(["RolloutOutcome", "record_outcome"], "outcome"),
        "RunnerSettings": "settings",
    }
)

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agl_train.runner' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
