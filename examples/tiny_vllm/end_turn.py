"""A vLLM logits processor: every turn is N generated tokens, then the end of turn, as a trained model's.

A tiny random model ends a turn only by chance (at once, or never until a token cap cuts it,
`finish_reason: length`), which is not how a trained model's turn goes. With this processor the
model may not sample a stop token (the request's stop token ids, as vLLM's `min_tokens` does)
before `AGL_END_TURN_AFTER` generated tokens, and after them only `AGL_END_TURN_TOKEN_ID` (Qwen's
`<|im_end|>`, 2 in the tiny model): the model itself ends the turn (`finish_reason: stop`), through
vLLM's own sampler, and the token ids are the ones it sampled. Nothing fakes the answer's text.

Start vLLM with `--logits-processors examples.tiny_vllm.end_turn:EndTurnAfter` (vLLM 0.31's v1
interface, `vllm.v1.sample.logits_processor`); the server-wide settings are environment variables
because vLLM builds a processor from its config alone. Without `AGL_END_TURN_AFTER` the processor
ends only the turns of requests that ask, with `"vllm_xargs": {"end_turn_after": N}` (vLLM hands
`vllm_xargs` to processors as `SamplingParams.extra_args`), so one server serves both kinds of test.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

AFTER_ENV = "AGL_END_TURN_AFTER"
TOKEN_ENV = "AGL_END_TURN_TOKEN_ID"
AFTER_ARG = "end_turn_after"
"""The `vllm_xargs` key of a request that asks for its turn to end after that many tokens."""


def end_turn_after(n: int) -> dict[str, Any]:
    """The request fields that ask a vLLM running EndTurnAfter to end this request's turn after `n` tokens."""
    return {"vllm_xargs": {AFTER_ARG: n}}


def _count(name: str, value: object) -> int:
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    raise ValueError(f"{name} must be a non-negative integer for EndTurnAfter, got {value!r:.40}")


class EndTurnAfter(LogitsProcessor):
    """Leaves only the end-of-turn token allowed once a request has generated its N tokens (its
    `end_turn_after`, else `AGL_END_TURN_AFTER`; a request with neither is left alone)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        default = os.environ.get(AFTER_ENV)
        self.after = None if default is None else _count(AFTER_ENV, default)
        self.token_id = _count(TOKEN_ENV, os.environ.get(TOKEN_ENV, ""))
        # Batch row -> the request's N, its generated ids (vLLM's live list: it grows as it decodes) and stop ids.
        self.requests: dict[int, tuple[int, Sequence[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is likeliest

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.requests, batch_update, self._track)

    def _track(
        self, params: SamplingParams, prompt_ids: list[int] | None, output_ids: list[int]
    ) -> tuple[int, Sequence[int], list[int]] | None:
        asked = (params.extra_args or {}).get(AFTER_ARG)
        after = self.after if asked is None else _count(AFTER_ARG, asked)
        if after is None:
            return None
        return after, output_ids, sorted({self.token_id, *params.all_stop_token_ids})

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        ended = []
        for row, (after, output, stop_ids) in self.requests.items():
            if len(output) >= after:
                ended.append(row)
            else:
                logits[row, stop_ids] = -float("inf")
        if ended:
            index = torch.tensor(ended, dtype=torch.long, device=logits.device)
            logits[index] = -float("inf")
            logits[index, self.token_id] = 0.0
        return logits
