"""`ProxySettings`: every option of the proxy's behaviour, in one place.

`agl proxy serve` builds one from its flags, `LLMProxy` takes one (or its fields as keyword
arguments) and `ProxyState` reads it. Where the proxy listens and its keys are `LLMProxy`'s
own arguments, not settings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..backends.balancing import DEFAULT_COOLDOWN_S
from ..controls.pausing import DEFAULT_HOLD_S, DEFAULT_RETRY_AFTER_S
from ..recording.exporter import DEFAULT_BACKPRESSURE_WAIT_S, DEFAULT_MAX_BUFFER

TOKEN_CHAIN_MODES = ("auto", "off")


@dataclass(frozen=True)
class ProxySettings:
    """How the proxy treats calls (docs/proxy.md describes each behaviour)."""

    logprobs: bool = False
    """Ask backends for the sampled tokens' logprobs."""
    sampling_overrides: Mapping[str, Any] = field(default_factory=dict)
    """Request fields that replace the client's on every call."""
    sampling_by_mode: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Sampling enforced by the rollout's mode: `{"train": {"temperature": 1.0}, "val": {...}}`
    (temperature, top_p, top_k, max_tokens; max_tokens is a cap). Changeable at run time."""
    sampling_on_conflict: str = "override"
    """`override` the agent's conflicting values, or `refuse` the call with 400."""
    require_token_ids: bool = False
    """Answer 502 to a call whose answer lacks token ids or whose ids disagree with its usage."""
    hold_s: float = DEFAULT_HOLD_S
    """How long a call arriving during a pause waits for the resume before its 429."""
    retry_after_s: int = DEFAULT_RETRY_AFTER_S
    """The `Retry-After` of a call refused because the pause outlasted `hold_s`."""
    cooldown_s: float = DEFAULT_COOLDOWN_S
    """How long a failed replica gets no calls."""
    max_span_buffer: int = DEFAULT_MAX_BUFFER
    """Spans of answered calls that may wait for the store before new calls wait."""
    backpressure_wait_s: float = DEFAULT_BACKPRESSURE_WAIT_S
    """How long a new call waits for room in the span buffer before a 503."""
    token_chain: str = "auto"
    """`auto`: chat calls to a vLLM that serves the token-in endpoints (`--enable-scale-out`) go through the
    token chain; `off`: every call is rendered by its backend."""

    def __post_init__(self) -> None:
        if self.token_chain not in TOKEN_CHAIN_MODES:
            raise ValueError(f"token_chain must be one of {', '.join(TOKEN_CHAIN_MODES)}, got {self.token_chain!r:.50}")
        for name in ("hold_s", "retry_after_s", "cooldown_s", "backpressure_wait_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r:.50}")
        if (
            isinstance(self.max_span_buffer, bool)
            or not isinstance(self.max_span_buffer, int)
            or self.max_span_buffer < 1
        ):
            raise ValueError(f"max_span_buffer must be an integer >= 1, got {self.max_span_buffer!r:.50}")
