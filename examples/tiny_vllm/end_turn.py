"""A vLLM logits processor that ends every turn after N generated tokens, as a trained model would.

A tiny random model never emits its end-of-turn token by chance, so an agent waiting for the
model to finish a turn waits until a token cap cuts it (`finish_reason: length`), which is not
how a trained model's turn ends. With this processor, after `AGL_END_TURN_AFTER` generated
tokens the only token the model may sample is `AGL_END_TURN_TOKEN_ID` (Qwen's `<|im_end|>`, 2 in
the tiny model): the model itself ends the turn (`finish_reason: stop`), through vLLM's own
sampler, and the token ids are the ones it sampled. Nothing fakes the answer's text.

Start vLLM with `--logits-processors examples.tiny_vllm.end_turn:EndTurnAfter` (vLLM 0.31's v1
interface, `vllm.v1.sample.logits_processor`); the two settings are environment variables
because vLLM builds a processor from its config alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

AFTER_ENV = "AGL_END_TURN_AFTER"
TOKEN_ENV = "AGL_END_TURN_TOKEN_ID"


def _setting(name: str) -> int:
    value = os.environ.get(name, "")
    if not value.isdigit():
        raise ValueError(f"{name} must be set to a non-negative integer for EndTurnAfter, got {value!r:.40}")
    return int(value)


class EndTurnAfter(LogitsProcessor):
    """Leaves only the end-of-turn token allowed once a request has generated `AGL_END_TURN_AFTER` tokens."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.after = _setting(AFTER_ENV)
        self.token_id = _setting(TOKEN_ENV)
        # Batch row -> the request's generated ids (vLLM's live list: it grows as the request decodes).
        self.outputs: dict[int, Sequence[int]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is likeliest

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.outputs, batch_update, self._track)

    @staticmethod
    def _track(params: SamplingParams, prompt_ids: list[int] | None, output_ids: list[int]) -> Sequence[int]:
        return output_ids

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        rows = [row for row, output in self.outputs.items() if len(output) >= self.after]
        if rows:
            index = torch.tensor(rows, dtype=torch.long, device=logits.device)
            logits[index] = -float("inf")
            logits[index, self.token_id] = 0.0
        return logits
