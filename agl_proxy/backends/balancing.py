"""Choosing a replica: sticky rollouts, least load, cool-down after failures.

A rollout's calls share a growing prompt prefix, so keeping them on one replica reuses
that replica's prefix cache. New rollouts (and calls without a rollout) go to the
least-loaded healthy replica. A replica that failed sits out a cool-down; when every
replica is cooling down, the one that failed longest ago is tried anyway rather than
failing the call outright.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence

from ..common.deployments import Deployment

DEFAULT_COOLDOWN_S = 30.0
# Sticky assignments kept; the oldest are forgotten first (a rollout that long idle has
# lost its prefix cache anyway).
DEFAULT_MAX_STICKY = 100_000


class Balancer:
    """Load, health and rollout affinity of replicas, keyed by `Deployment.key`.

    State survives `update_model_list`: a replica listed again keeps its load and cool-down.
    """

    def __init__(
        self,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        max_sticky: int = DEFAULT_MAX_STICKY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cooldown_s = cooldown_s
        self.max_sticky = max_sticky
        self._clock = clock
        self.in_flight: dict[str, int] = {}
        self._assigned: dict[str, int] = {}
        self._cooldown_until: dict[str, float] = {}
        self._sticky: OrderedDict[tuple[str, str], str] = OrderedDict()

    def is_healthy(self, deployment: Deployment) -> bool:
        return self._cooldown_until.get(deployment.key, 0.0) <= self._clock()

    def choose(
        self,
        replicas: Sequence[Deployment],
        rollout_id: str | None = None,
        exclude: Collection[str] = (),
    ) -> Deployment | None:
        """The replica for the next call, or None when every replica is excluded."""
        candidates = [d for d in replicas if d.key not in exclude]
        if not candidates:
            return None
        healthy = [d for d in candidates if self.is_healthy(d)]
        sticky_key = (candidates[0].model_name, rollout_id) if rollout_id else None
        if sticky_key is not None:
            current = self._sticky.get(sticky_key)
            for d in healthy:
                if d.key == current:
                    self._sticky.move_to_end(sticky_key)
                    return d
        if healthy:
            # Ties on load go to the replica that was given fewer rollouts, so sequential
            # rollouts (load always 0) still spread over the replicas.
            chosen = min(healthy, key=lambda d: (self.in_flight.get(d.key, 0), self._assigned.get(d.key, 0)))
        else:
            chosen = min(candidates, key=lambda d: self._cooldown_until.get(d.key, 0.0))
        if sticky_key is not None:
            self._sticky[sticky_key] = chosen.key
            self._sticky.move_to_end(sticky_key)
            self._assigned[chosen.key] = self._assigned.get(chosen.key, 0) + 1
            while len(self._sticky) > self.max_sticky:
                self._sticky.popitem(last=False)
        return chosen

    def acquire(self, deployment: Deployment) -> None:
        self.in_flight[deployment.key] = self.in_flight.get(deployment.key, 0) + 1

    def release(self, deployment: Deployment) -> None:
        self.in_flight[deployment.key] = max(0, self.in_flight.get(deployment.key, 0) - 1)

    def mark_failed(self, deployment: Deployment) -> None:
        """Take the replica out of rotation for the cool-down."""
        self._cooldown_until[deployment.key] = self._clock() + self.cooldown_s

    def mark_ok(self, deployment: Deployment) -> None:
        self._cooldown_until.pop(deployment.key, None)
