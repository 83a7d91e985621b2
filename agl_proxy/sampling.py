"""Sampling overrides the proxy imposes, for every call or by the rollout's mode.

Training rollouts usually sample (temperature 1) while validation is greedy; the agent
code does not know which one it runs in. With `by_mode={"train": {...}, "val": {...}}`
the proxy reads each rollout's `mode` from the store once (then from a bounded cache)
and applies that mode's fields over the client's.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from agl_store.base import LightningStore

logger = logging.getLogger(__name__)

MAX_CACHED_ROLLOUTS = 10_000


class SamplingPolicy:
    """Request fields to impose on a call: `overrides`, then those of the rollout's mode."""

    def __init__(
        self,
        overrides: Mapping[str, Any] | None = None,
        by_mode: Mapping[str, Mapping[str, Any]] | None = None,
        store: LightningStore | None = None,
    ) -> None:
        self.overrides: dict[str, Any] = dict(overrides or {})
        self.by_mode: dict[str, dict[str, Any]] = {mode: dict(fields) for mode, fields in (by_mode or {}).items()}
        self.store = store
        self._modes: OrderedDict[str, str | None] = OrderedDict()

    @property
    def needs_rollout(self) -> bool:
        return bool(self.by_mode) and self.store is not None

    async def for_rollout(self, rollout_id: str) -> Mapping[str, Any]:
        """The fields to impose on a call of `rollout_id` ("" for calls without a rollout)."""
        if not self.needs_rollout or not rollout_id:
            return self.overrides
        mode = await self._mode(rollout_id)
        extra = self.by_mode.get(mode or "")
        return {**self.overrides, **extra} if extra else self.overrides

    async def _mode(self, rollout_id: str) -> str | None:
        if rollout_id in self._modes:
            self._modes.move_to_end(rollout_id)
            return self._modes[rollout_id]
        assert self.store is not None
        try:
            rollout = await self.store.get_rollout_by_id(rollout_id)
        except Exception as exc:  # a store outage must not fail the call
            logger.warning("agl_proxy: cannot read the mode of rollout %r, no mode overrides: %r", rollout_id, exc)
            return None
        mode = rollout.mode if rollout is not None else None
        self._modes[rollout_id] = mode
        if len(self._modes) > MAX_CACHED_ROLLOUTS:
            self._modes.popitem(last=False)
        return mode
