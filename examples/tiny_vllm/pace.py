"""A vLLM logits processor that slows generation down for the requests that ask: each engine step
with such a request in its batch takes at least its `pace_s` seconds.

A tiny model on the CPU generates hundreds of tokens a second, and on a loaded machine a client
that acts on the first streamed tokens (a test that starts a weight update mid-generation) may
see the generation end first. A request with `"vllm_xargs": {"pace_s": 0.01}` (`paced(0.01)`)
takes 0.01 s a token at least, whatever the load; the ids are still the model's own samples, and
requests that do not ask are not slowed (beyond a batch they share a step with).

Start vLLM with `--logits-processors examples.tiny_vllm.pace:Paced` (vLLM 0.31's v1 interface;
several processors may follow the flag).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

PACE_ARG = "pace_s"


def paced(seconds: float) -> dict[str, Any]:
    """The `vllm_xargs` that ask a vLLM running Paced to take at least `seconds` per generated token."""
    return {PACE_ARG: seconds}


class Paced(LogitsProcessor):
    """Sleeps out what is left of the slowest pace asked for by a request in the step's batch."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.paces: dict[int, float] = {}
        self.last_step = time.monotonic()

    def is_argmax_invariant(self) -> bool:
        # It leaves the logits alone, but vLLM skips argmax-invariant processors for greedy
        # batches, and the greedy tests need the pace too.
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.paces, batch_update, self._track)

    @staticmethod
    def _track(params: SamplingParams, prompt_ids: list[int] | None, output_ids: list[int]) -> float | None:
        pace = (params.extra_args or {}).get(PACE_ARG)
        return float(pace) if isinstance(pace, (int, float)) and pace > 0 else None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.paces:
            time.sleep(max(0.0, self.last_step + max(self.paces.values()) - time.monotonic()))
        self.last_step = time.monotonic()
        return logits
