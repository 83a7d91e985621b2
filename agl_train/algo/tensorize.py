"""Rows → the padded tensors verl's PPO reads (torch and numpy only; no verl import here).

Layout, as verl's rollout produces it: prompts left-padded to `max_prompt_length`,
responses right-padded to `max_response_length`, `input_ids` their concatenation.
The reward sits on the last valid response token of `token_level_scores`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np
import torch

from ..core.aggregate import Limits, Row

_NUMPY_TYPES = {"i": np.int32, "b": np.int8}

SAMPLING_VERSIONS = "sampling_versions"
"""The batch key of the weight version that sampled each response token (`Row.versions`)."""
UNKNOWN_VERSION = -1
"""`sampling_versions` where the version is not known: inserted tokens, padding, calls without one."""


def _values(values: Sequence[int]) -> np.ndarray | Sequence[int]:
    """An `array('i')`/`array('b')` as a numpy view of its memory (no Python int per id);
    anything else as it is, for numpy to convert."""
    if type(values) is array:
        return np.frombuffer(values, dtype=_NUMPY_TYPES[values.typecode])
    return values


def rows_to_tensors(rows: Sequence[Row], limits: Limits, pad_token_id: int) -> dict[str, torch.Tensor]:
    """The tensor batch of `rows`, shapes `[B, P]` / `[B, R]` / `[B, P + R]` with P, R the limits.

    Keys: `prompts`, `responses`, `input_ids`, `attention_mask`, `position_ids`,
    `response_mask`, `token_level_scores` (float32: reward at index len(response) - 1),
    `is_drop_mask` (bool, `[B]`), `sampling_versions` (int64: `Row.versions` per token,
    `UNKNOWN_VERSION` where not known), and `rollout_log_probs` (float32) when every row has logprobs.
    `position_ids[b, t] = max(cumsum(attention_mask[b])[t] - 1, 0)`.
    Over-long prompts keep their last P tokens (the ones nearest the response); such rows
    are marked `is_drop` and never trained on, this only gives them a shape.
    """
    if not rows:
        raise ValueError("cannot build a training batch from zero rows")
    n, p_len, r_len = len(rows), limits.max_prompt_length, limits.max_response_length
    # Filled row by row through numpy slices: converting nested Python lists with
    # torch.tensor costs ~10x more on 8k-token rows; rows of arrays copy as memory.
    # input_ids is written once (padding included) and prompts/responses copied out of it:
    # cheaper than padding all three and concatenating (~90 MB a tensor at 8k tokens).
    input_ids = np.empty((n, p_len + r_len), dtype=np.int64)
    attention = np.zeros((n, p_len + r_len), dtype=np.int64)
    # Written per row rather than as cumsum/clamp over the whole batch (three passes over
    # [B, P + R]): 0 before the prompt, then 0, 1, ... over prompt and response, then flat.
    positions = np.zeros((n, p_len + r_len), dtype=np.int64)
    counting = np.arange(p_len + r_len, dtype=np.int64)
    response_mask = np.zeros((n, r_len), dtype=np.int64)
    scores = np.zeros((n, r_len), dtype=np.float32)
    versions = np.full((n, r_len), UNKNOWN_VERSION, dtype=np.int64)
    with_logprobs = all(row.logprobs is not None for row in rows)
    logprobs = np.zeros((n, r_len), dtype=np.float32) if with_logprobs else None
    for b, row in enumerate(rows):
        if not row.response_ids:
            raise ValueError(f"row {row.rollout_id}/{row.turn_index} has no response tokens")
        prompt = _values(row.prompt_ids)[-p_len:]
        n_response = min(len(row.response_ids), r_len)
        start, end = p_len - len(prompt), p_len + n_response
        input_ids[b, :start] = pad_token_id
        input_ids[b, start:p_len] = prompt
        input_ids[b, p_len:end] = _values(row.response_ids)[:n_response]
        input_ids[b, end:] = pad_token_id
        attention[b, start:end] = 1
        positions[b, start:end] = counting[: end - start]
        positions[b, end:] = end - start - 1
        response_mask[b, :n_response] = _values(row.response_mask)[:n_response]
        scores[b, n_response - 1] = row.reward
        at = 0
        for version, count in row.versions:
            if version is not None:
                versions[b, at : min(at + count, n_response)] = version
            at += count
        if logprobs is not None and row.logprobs is not None:  # all rows have them, or none is used
            logprobs[b, :n_response] = row.logprobs[:n_response]

    tensors = {
        "prompts": torch.from_numpy(np.ascontiguousarray(input_ids[:, :p_len])),
        "responses": torch.from_numpy(np.ascontiguousarray(input_ids[:, p_len:])),
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attention),
        "position_ids": torch.from_numpy(positions),
        "response_mask": torch.from_numpy(response_mask),
        "token_level_scores": torch.from_numpy(scores),
        "is_drop_mask": torch.tensor([row.is_drop for row in rows], dtype=torch.bool),
        SAMPLING_VERSIONS: torch.from_numpy(versions),
    }
    if logprobs is not None:
        tensors["rollout_log_probs"] = torch.from_numpy(logprobs)
    return tensors


def rows_to_non_tensors(rows: Sequence[Row]) -> dict[str, np.ndarray]:
    """The per-row non-tensor fields: `uid` (the prompt group), `rollout_id`, `turn_index`."""
    return {
        "uid": np.array([row.uid for row in rows], dtype=object),
        "rollout_id": np.array([row.rollout_id for row in rows], dtype=object),
        "turn_index": np.array([row.turn_index for row in rows], dtype=object),
    }
