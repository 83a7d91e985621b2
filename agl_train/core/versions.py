"""Which weights sampled which tokens: a row's response as version segments (docs/trainer.md,
"Staleness and off-policy correction").

Each LLM call span records the weight version its deployment was registered with
(`agl.model_version`; the trainer registers its replicas under the step's version). A row's
response is the concatenation of its calls' answers and the tokens inserted between them, so its
versions are run-length segments `((version, n_tokens), ...)` over the response: a call's sampled
tokens carry the call's version, inserted tokens (tool output, template markers: never trained)
and calls whose span names no integer version carry None.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Segments = tuple[tuple[int | None, int], ...]
"""`((version, n_tokens), ...)` over a row's response tokens, in order; None: not known."""


def version_of(value: Any) -> int | None:
    """The weight version an `agl.model_version` attribute names: a non-negative integer, or a
    string of one (`"3"`); None for anything else (absent, a resources id, a name)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def joined(segments: Iterable[tuple[int | None, int]]) -> Segments:
    """`segments` with empty ones left out and neighbours of the same version joined."""
    out: list[tuple[int | None, int]] = []
    for version, n in segments:
        if n <= 0:
            continue
        if out and out[-1][0] == version:
            out[-1] = (version, out[-1][1] + n)
        else:
            out.append((version, n))
    return tuple(out)


def truncated(segments: Segments, n_tokens: int) -> Segments:
    """The segments of the first `n_tokens` tokens."""
    out: list[tuple[int | None, int]] = []
    left = n_tokens
    for version, n in segments:
        if left <= 0:
            break
        out.append((version, min(n, left)))
        left -= n
    return tuple(out)


__all__ = ["Segments", "joined", "truncated", "version_of"]
