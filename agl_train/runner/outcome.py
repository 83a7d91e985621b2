"""How a rollout ended, and how that is written to the store (reward span, attempt status).

Every runner (local subprocess, Kubernetes Job) ends a rollout with a `RolloutOutcome` and
hands it to `record_outcome`: the reward (if any) becomes an `agl.reward` span, then the
attempt gets its final status and a metadata record saying why. A timed-out attempt is
marked `timeout`, so its rollout (one attempt, no retry) ends `failed`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from agl_store.base import LightningStore
from agl_store.errors import StoreError
from agl_store.models import reward_span

logger = logging.getLogger(__name__)

OutcomeStatus = Literal["succeeded", "failed", "timeout"]
MESSAGE_LIMIT = 4000
"""Characters of an agent's error output kept in the attempt's metadata."""
METADATA_KEY = "agl.outcome"


@dataclass(frozen=True)
class RolloutOutcome:
    """The end of one attempt: its status, the reward it reported, and a message on failure."""

    rollout_id: str
    attempt_id: str
    status: OutcomeStatus
    reward: float | None = None
    message: str = ""
    exit_code: int | None = None

    def metadata(self) -> dict[str, Any]:
        return {
            METADATA_KEY: {
                "status": self.status,
                "reward": self.reward,
                "exit_code": self.exit_code,
                "message": self.message[-MESSAGE_LIMIT:],
            }
        }


async def record_outcome(store: LightningStore, outcome: RolloutOutcome) -> None:
    """Write `outcome` to the store. A store that already ended the attempt (its own timeout
    watchdog was faster) keeps its verdict; that is logged, not raised."""
    try:
        if outcome.reward is not None and outcome.status == "succeeded":
            await store.add_span(reward_span(outcome.rollout_id, outcome.attempt_id, outcome.reward))
        await store.update_attempt(
            outcome.rollout_id, outcome.attempt_id, status=outcome.status, metadata=outcome.metadata()
        )
    except StoreError as exc:
        logger.warning("rollout %s: could not record outcome %s: %s", outcome.rollout_id, outcome.status, exc)
