"""Rollout execution for the trainer: local subprocesses, Kubernetes Jobs, the dispatcher that
feeds them from the store's queue, and the prompt groups a step trains on."""

from .dispatch import RolloutDispatcher, Runner
from .env import MissingInputField, RolloutEndpoints
from .groups import Collected, Group, GroupTracker
from .local import LocalRunner
from .outcome import RolloutOutcome, record_outcome
from .settings import RunnerSettings

__all__ = [
    "Collected",
    "Group",
    "GroupTracker",
    "LocalRunner",
    "MissingInputField",
    "RolloutDispatcher",
    "RolloutEndpoints",
    "RolloutOutcome",
    "Runner",
    "RunnerSettings",
    "record_outcome",
]
