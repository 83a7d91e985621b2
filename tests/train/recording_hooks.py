"""A hooks module (`agentlightning.hooks=tests.train.recording_hooks`) that records what `fit()`
hands it: the order of the calls, and a copy of each step's update batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

CALLS: list[str] = []
"""`startup`, then `batch <step>` for every step that updated the actor, in the order they ran."""
BATCHES: dict[int, StepBatch] = {}


@dataclass(frozen=True)
class StepBatch:
    """The update batch of one step, as `update_actor` got it."""

    advantages: torch.Tensor
    response_mask: torch.Tensor
    responses: torch.Tensor
    prompts: torch.Tensor
    attention_mask: torch.Tensor
    token_level_scores: torch.Tensor
    rollout_id: np.ndarray
    uid: np.ndarray
    turn_index: np.ndarray

    def __len__(self) -> int:
        return len(self.rollout_id)


def reset() -> None:
    """Forget what an earlier `fit()` recorded."""
    CALLS.clear()
    BATCHES.clear()


class RolloutHooks:
    def on_startup(self) -> None:
        CALLS.append("startup")

    def on_batch(self, step: int, batch: Any) -> None:
        CALLS.append(f"batch {step}")
        tensors = {key: batch.batch[key].clone() for key in StepBatch.__dataclass_fields__ if key in batch.batch.keys()}
        arrays = {key: batch.non_tensor_batch[key].copy() for key in ("rollout_id", "uid", "turn_index")}
        BATCHES[step] = StepBatch(**tensors, **arrays)
