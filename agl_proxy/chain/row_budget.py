"""The row budget: what a call may generate so that the training row it continues stays whole.

In a trajectory-level run one row is one root-to-leaf path of an attempt's calls: the root
call's prompt, then every later token (the sampled ids and the ids inserted between calls) as
the row's response part, which holds at most `row_tokens` (the trainer's
`trajectory_max_response_length`). The token chain knows a call's exact prompt ids before
generating, so the row's used length is exact: the prompt's length minus the root's prompt
length. A call continuing a row (bridged, or a retry of a call that did) may generate what is
left; a call that starts a row (rendered or branched) a whole row.

A call whose row is full (nothing left) is served all the same: its prompt, kept as it is,
starts a new row (`branched`, cause `row_full`). A 400 would end most agents' runs and one
token per call would only repeat the problem at every later call; a new row keeps the agent
served and every row within its limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..controls.sampling import ROW_TOKENS
from .links import Link

ROW_FULL = "row_full"
"""The `agl.chain` cause of a call whose parent's row has no room left: its prompt starts a row."""
ROW_USED = "row_used"


@dataclass(frozen=True, slots=True)
class RowFit:
    """A call's place in its row."""

    link: Link
    """The call's link; a new root (`branched`, `row_full`) when its row was full."""
    root_prompt_len: int
    """The prompt length of the row's first call (this call's own when it starts the row)."""
    used: int
    """The row's response tokens before this call's answer (0 for a call that starts a row)."""
    row_tokens: int | None
    """The budget; None without one."""

    def cap(self, max_tokens: int) -> int:
        """`max_tokens` (the call's own cap) bounded by what the row has left."""
        return max_tokens if self.row_tokens is None else min(max_tokens, self.row_tokens - self.used)

    def capped_render(self, render: dict[str, Any]) -> dict[str, Any]:
        """The render's answer with its `max_tokens` (always set: generate takes it as it is)
        bounded by the row; `render` itself without a budget."""
        if self.row_tokens is None:
            return render
        sampling = dict(render["sampling_params"])
        sampling["max_tokens"] = self.cap(int(sampling["max_tokens"]))
        return {**render, "sampling_params": sampling}

    def attributes(self, render: Mapping[str, Any]) -> dict[str, int] | None:
        """What a span's `agl.sampling` adds under a budget: the cap the engine got (`max_tokens`
        of the capped `render`), the budget (`row_tokens`) and the row's tokens before the call
        (`row_used`); None without a budget."""
        if self.row_tokens is None:
            return None
        max_tokens = int(render["sampling_params"]["max_tokens"])
        return {"max_tokens": max_tokens, ROW_TOKENS: self.row_tokens, ROW_USED: self.used}


def fit_row(link: Link, prompt_len: int, row_tokens: int | None) -> RowFit:
    """Where a call with `prompt_len` prompt ids and `link` stands in a row of `row_tokens` (None: no budget)."""
    parent = link.parent
    root = parent.root_prompt_len if parent is not None and link.kind in ("bridged", "retry") else prompt_len
    used = prompt_len - root
    if row_tokens is not None and used >= row_tokens:
        return RowFit(Link("branched", parent=parent, cause=ROW_FULL), prompt_len, 0, row_tokens)
    return RowFit(link, root, used, row_tokens)
