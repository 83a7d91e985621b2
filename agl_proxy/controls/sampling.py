"""Sampling the proxy imposes, for every call or by the rollout's mode.

Training rollouts usually sample (temperature 1) while validation is greedy; the agent
code does not know which one it runs in. With `by_mode={"train": {...}, "val": {...}}`
the proxy reads each rollout's `mode` from the store once (then from a bounded cache)
and enforces that mode's fields on the call: it replaces the agent's values
(`on_conflict="override"`) or answers 400 to a call that asks for another value
(`"refuse"`). The mode `all` applies to every call, also to calls of no rollout or of a rollout
without a mode; a rollout mode's own fields win over it. `max_tokens` is a cap: the agent's
value when lower. `row_tokens` is the row budget of a trajectory-level run: a call may generate
at most what the training row its prompt continues can still hold (`row_budget`); it is never
sent to the backend and never refused. The mode table can be replaced at run time (`POST /proxy/sampling`).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agl_store.base import LightningStore

from ..common.errors import BadRequestError

logger = logging.getLogger(__name__)

MAX_CACHED_ROLLOUTS = 10_000
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens")
"""The request fields a mode may impose, and what a span's `agl.sampling` records of the request."""
ROW_TOKENS = "row_tokens"
"""The row budget: the tokens a trajectory row's response part holds (the call's own cap is the rest of it)."""
MODE_FIELDS = (*SAMPLING_FIELDS, ROW_TOKENS)
"""What a mode may set."""
MAX_TOKENS_ALIASES = ("max_tokens", "max_completion_tokens")
"""Where an agent may put its token limit (newer OpenAI SDKs send the second); the cap bounds both."""
ON_CONFLICT = ("override", "refuse")
ALL = "all"
"""The mode whose fields apply to every call."""


def checked_by_mode(by_mode: Any, where: str = "by_mode") -> dict[str, dict[str, float | int]]:
    """`by_mode` validated: {mode: {field: number}} with fields from MODE_FIELDS.

    ValueError names the first bad mode, field or value (as `by_mode.train.top_k`).
    """
    if not isinstance(by_mode, Mapping):
        raise ValueError(f"{where} must be an object of modes, got {type(by_mode).__name__}")
    out: dict[str, dict[str, float | int]] = {}
    for mode, fields in by_mode.items():
        if not isinstance(mode, str) or not mode:
            raise ValueError(f"{where} has a mode that is not a non-empty string: {mode!r:.50}")
        if not isinstance(fields, Mapping):
            raise ValueError(f"{where}.{mode} must be an object of fields, got {type(fields).__name__}")
        out[mode] = {}
        for name, value in fields.items():
            field = f"{where}.{mode}.{name}"
            if name not in MODE_FIELDS:
                raise ValueError(f"{field:.100} is not a sampling field this proxy enforces ({', '.join(MODE_FIELDS)})")
            out[mode][name] = _checked_value(name, value, field)
    return out


def _checked_value(name: str, value: Any, field: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number, got {value!r:.50}")
    if name in ("top_k", "max_tokens", ROW_TOKENS):
        if value != int(value):
            raise ValueError(f"{field} must be an integer, got {value!r}")
        value = int(value)
        if name in ("max_tokens", ROW_TOKENS) and value < 1:
            raise ValueError(f"{field} must be >= 1, got {value}")
        if name == "top_k" and value < -1:
            raise ValueError(f"{field} must be -1 (no limit) or >= 0, got {value}")
    elif value < 0:
        raise ValueError(f"{field} must be >= 0, got {value}")
    return value


def checked_on_conflict(value: Any) -> str:
    if value not in ON_CONFLICT:
        raise ValueError(f"on_conflict must be one of {', '.join(ON_CONFLICT)}, got {value!r:.50}")
    return str(value)


@dataclass(frozen=True)
class Enforcement:
    """The sampling one rollout mode imposes."""

    mode: str
    fields: Mapping[str, float | int]
    on_conflict: str

    @property
    def row_tokens(self) -> int | None:
        """The row budget, if the mode sets one."""
        value = self.fields.get(ROW_TOKENS)
        return int(value) if value is not None else None

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """`body` with the fields imposed; BadRequestError names a conflicting field under `refuse`.

        With a row budget, no call generates more than a whole row holds (a call that starts a
        row); the token chain caps a call that continues a row further (`row_budget`)."""
        out = dict(body)
        for name, imposed in self.fields.items():
            if name == ROW_TOKENS:
                continue
            if name == "max_tokens":
                self._cap(out, int(imposed), self.on_conflict == "refuse")
                continue
            given = out.get(name)
            if given is not None and given != imposed and self.on_conflict == "refuse":
                raise self._conflict(name, given, f"{imposed!r}")
            out[name] = imposed
        row = self.row_tokens
        if row is not None:
            # The agent cannot know what its row holds: this cap is never a conflict.
            self._cap(out, row, refuse=False)
        return out

    def _cap(self, out: dict[str, Any], cap: int, refuse: bool) -> None:
        given = {name: out[name] for name in MAX_TOKENS_ALIASES if out.get(name) is not None}
        for name, value in given.items():
            if not isinstance(value, int) or isinstance(value, bool) or value > cap:
                if refuse:
                    raise self._conflict(name, value, f"at most {cap}")
                out[name] = cap
        if not given:
            out["max_tokens"] = cap

    def _conflict(self, name: str, given: Any, allowed: str) -> BadRequestError:
        return BadRequestError(
            f"{name}={given!r:.50} conflicts with the proxy's sampling for {self.mode!r} rollouts ({name} {allowed})"
        )


class SamplingPolicy:
    """Request fields to impose on a call: `overrides` on every call, `by_mode` by the rollout's mode."""

    def __init__(
        self,
        overrides: Mapping[str, Any] | None = None,
        by_mode: Mapping[str, Mapping[str, Any]] | None = None,
        store: LightningStore | None = None,
        on_conflict: str = "override",
    ) -> None:
        self.overrides: dict[str, Any] = dict(overrides or {})
        self.by_mode = checked_by_mode(by_mode or {}, "sampling_by_mode")
        self.on_conflict = checked_on_conflict(on_conflict)
        self.store = store
        self._modes: OrderedDict[str, str | None] = OrderedDict()

    def update(self, body: Mapping[str, Any]) -> None:
        """Apply a `POST /proxy/sampling` body; ValueError names a bad field and changes nothing."""
        unknown = sorted(set(body) - {"by_mode", "on_conflict"})
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r:.50} (the body has by_mode and on_conflict)")
        by_mode = checked_by_mode(body["by_mode"]) if "by_mode" in body else self.by_mode
        on_conflict = checked_on_conflict(body["on_conflict"]) if "on_conflict" in body else self.on_conflict
        self.by_mode, self.on_conflict = by_mode, on_conflict
        logger.info("agl_proxy sampling by mode: %s (on conflict: %s)", by_mode or "none", on_conflict)

    def state(self) -> dict[str, Any]:
        return {"by_mode": self.by_mode, "on_conflict": self.on_conflict}

    async def for_rollout(self, rollout_id: str) -> Enforcement | None:
        """What `all` and the mode of `rollout_id` impose ("" for calls without a rollout); None when nothing."""
        every = self.by_mode.get(ALL, {})
        mode = None
        if self.store is not None and rollout_id and len(self.by_mode) > (ALL in self.by_mode):
            mode = await self._mode(rollout_id)
        own = self.by_mode.get(mode) if mode is not None and mode != ALL else None
        if own is None:
            return Enforcement(ALL, every, self.on_conflict) if every else None
        assert mode is not None
        return Enforcement(mode, {**every, **own}, self.on_conflict)

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
