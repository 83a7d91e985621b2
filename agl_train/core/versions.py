"""Which weights sampled which tokens: a row's response as version segments (docs/trainer.md,
"Staleness and off-policy correction").

Each LLM call span records the weight version its deployment was registered with
(`agl.model_version`; the trainer registers its replicas under the step's version), and, from
the proxy's token chain, each choice's segments (`agl.choices[i].segments`): which versions
sampled its tokens, several when the call went on across a weight update. A row's response is
the concatenation of its calls' answers and the tokens inserted between them, so its versions are
run-length segments `((version, n_tokens), ...)` over the response: a call's sampled tokens carry
their segment's version (the call's version when its span has no segments), inserted tokens (tool
output, template markers: never trained) and versions that are not integers carry None.
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


def segments_of(value: Any, n_tokens: int) -> Segments | None:
    """The segments an `agl.choices[i].segments` attribute holds for a choice of `n_tokens`
    tokens: `[[version, n], ...]` with counts summing to `n_tokens`, each version through
    `version_of`; None when absent or not shaped so (the caller then gives every token the call's
    version: counts that do not line up cannot say which token is whose)."""
    if not isinstance(value, list):
        return None
    pairs: list[tuple[int | None, int]] = []
    for entry in value:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            return None
        version, n = entry
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            return None
        pairs.append((version_of(version), n))
    if sum(n for _, n in pairs) != n_tokens:
        return None
    return joined(pairs)


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


__all__ = ["Segments", "joined", "segments_of", "truncated", "version_of"]
