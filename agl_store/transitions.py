"""The status rules of rollouts, attempts and workers, in one place.

Pure functions over status strings: every backend asks these tables whether an attempt's
move is legal and what an attempt's status means for its rollout and its worker, so the
rules cannot drift between code paths. A rollout's own status may be set to any status,
as in agent-lightning 0.3: algorithms requeue failed rollouts and retry finished ones.
"""

from __future__ import annotations

from collections.abc import Mapping

from .errors import ConflictError, InvalidInputError
from .models import (
    ATTEMPT_STATUSES,
    ROLLOUT_MODES,
    ROLLOUT_STATUSES,
    WORKER_STATUSES,
    AttemptStatus,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    WorkerStatus,
)

ATTEMPT_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "preparing": frozenset({"running", "succeeded", "failed", "unresponsive", "timeout"}),
    "running": frozenset({"succeeded", "failed", "unresponsive", "timeout"}),
    # An attempt judged unresponsive may still be alive: a late span revives it, a late
    # final report is accepted (agent-lightning does the same).
    "unresponsive": frozenset({"running", "succeeded", "failed", "timeout"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "timeout": frozenset(),
}
"""Legal attempt status moves, besides staying put."""

ATTEMPT_END_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "unresponsive", "timeout"})
"""Attempt statuses that set `end_time` (an unresponsive attempt that revives clears it)."""

RETRYABLE_ATTEMPT_STATUSES: frozenset[str] = frozenset({"failed", "timeout", "unresponsive"})


def check_rollout_status(value: object, field: str = "status") -> RolloutStatus:
    """`value` if it is a rollout status, else InvalidInputError naming `field`."""
    if value not in ROLLOUT_STATUSES:
        raise InvalidInputError(f"{field}: unknown rollout status {value!r}; expected one of {list(ROLLOUT_STATUSES)}")
    return value  # type: ignore[return-value]


def check_rollout_mode(value: object, field: str = "mode") -> RolloutMode | None:
    """`value` if it is a rollout mode or None, else InvalidInputError naming `field`."""
    if value is not None and value not in ROLLOUT_MODES:
        raise InvalidInputError(
            f"{field}: unknown rollout mode {value!r}; expected one of {list(ROLLOUT_MODES)} or None"
        )
    return value  # type: ignore[return-value]


def check_attempt_status(value: object, field: str = "status") -> AttemptStatus:
    """`value` if it is an attempt status, else InvalidInputError naming `field`."""
    if value not in ATTEMPT_STATUSES:
        raise InvalidInputError(f"{field}: unknown attempt status {value!r}; expected one of {list(ATTEMPT_STATUSES)}")
    return value  # type: ignore[return-value]


def check_worker_status(value: object, field: str = "status") -> WorkerStatus:
    """`value` if it is a worker status, else InvalidInputError naming `field`."""
    if value not in WORKER_STATUSES:
        raise InvalidInputError(f"{field}: unknown worker status {value!r}; expected one of {list(WORKER_STATUSES)}")
    return value  # type: ignore[return-value]


def check_attempt_move(rollout_id: str, attempt_id: str, old: str, new: str) -> None:
    """Raise ConflictError unless an attempt may go from `old` to `new`."""
    if old != new and new not in ATTEMPT_TRANSITIONS[old]:
        raise ConflictError(f"attempt {attempt_id} of rollout {rollout_id} cannot go from {old!r} to {new!r}")


def rollout_status_from_attempt(attempt_status: str, attempt_sequence_id: int, config: RolloutConfig) -> RolloutStatus:
    """The rollout status implied by its latest attempt's status.

    A failed, timed-out or unresponsive attempt requeues the rollout when that status is in
    `config.retry_condition` and fewer than `config.max_attempts` attempts were made.
    """
    if attempt_status in RETRYABLE_ATTEMPT_STATUSES:
        if attempt_status in config.retry_condition and attempt_sequence_id < config.max_attempts:
            return "requeuing"
        return "failed"
    return attempt_status  # type: ignore[return-value]  # preparing / running / succeeded


def worker_status_for_attempt(attempt_status: str) -> WorkerStatus:
    """What an attempt's status says about the worker running it (agent-lightning's rule)."""
    if attempt_status in ("succeeded", "failed"):
        return "idle"
    if attempt_status in ("timeout", "unresponsive"):
        return "unknown"
    return "busy"
