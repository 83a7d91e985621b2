"""agl_store.transitions: the status rules every backend enforces, checked as tables."""

from __future__ import annotations

import pytest

from agl_store import ConflictError, InvalidInputError, RolloutConfig
from agl_store.models import ATTEMPT_STATUSES
from agl_store.transitions import (
    ATTEMPT_TRANSITIONS,
    check_attempt_move,
    check_attempt_status,
    check_rollout_status,
    check_worker_status,
    rollout_status_from_attempt,
    worker_status_for_attempt,
)


def test_the_attempt_table_covers_every_status() -> None:
    assert set(ATTEMPT_TRANSITIONS) == set(ATTEMPT_STATUSES)
    for targets in ATTEMPT_TRANSITIONS.values():
        assert targets <= set(ATTEMPT_STATUSES)


@pytest.mark.parametrize(
    "old, new, legal",
    [
        ("preparing", "running", True),
        ("running", "succeeded", True),
        ("running", "preparing", False),
        ("unresponsive", "running", True),  # a late span revives it
        ("unresponsive", "succeeded", True),  # a late final report is accepted
        ("timeout", "running", False),
        ("succeeded", "failed", False),
        ("failed", "failed", True),  # repeating a status is not a move
    ],
)
def test_attempt_moves(old: str, new: str, legal: bool) -> None:
    if legal:
        check_attempt_move("ro-1", "at-1", old, new)
    else:
        with pytest.raises(ConflictError):
            check_attempt_move("ro-1", "at-1", old, new)


@pytest.mark.parametrize(
    "attempt_status, attempt_number, config, expected",
    [
        ("running", 1, RolloutConfig(), "running"),
        ("succeeded", 3, RolloutConfig(max_attempts=3), "succeeded"),
        ("failed", 1, RolloutConfig(), "failed"),  # no retry_condition: no retry
        ("failed", 1, RolloutConfig(max_attempts=2, retry_condition=["failed"]), "requeuing"),
        ("failed", 2, RolloutConfig(max_attempts=2, retry_condition=["failed"]), "failed"),  # attempts used up
        ("timeout", 1, RolloutConfig(max_attempts=5, retry_condition=["failed"]), "failed"),  # not listed
        ("unresponsive", 1, RolloutConfig(max_attempts=5, retry_condition=["unresponsive"]), "requeuing"),
    ],
)
def test_latest_attempt_decides_the_rollout(
    attempt_status: str, attempt_number: int, config: RolloutConfig, expected: str
) -> None:
    assert rollout_status_from_attempt(attempt_status, attempt_number, config) == expected


@pytest.mark.parametrize(
    "attempt_status, worker_status",
    [("preparing", "busy"), ("running", "busy"), ("succeeded", "idle"), ("failed", "idle"), ("timeout", "unknown")],
)
def test_worker_status_follows_its_attempt(attempt_status: str, worker_status: str) -> None:
    assert worker_status_for_attempt(attempt_status) == worker_status


def test_unknown_statuses_name_the_field() -> None:
    with pytest.raises(InvalidInputError, match="status_in"):
        check_rollout_status("done", "status_in")
    with pytest.raises(InvalidInputError, match="status"):
        check_attempt_status("exploded")
    with pytest.raises(InvalidInputError, match="status_in: unknown worker status 'asleep'"):
        check_worker_status("asleep", "status_in")
