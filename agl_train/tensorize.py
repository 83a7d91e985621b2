"""Rows → the padded tensors verl's PPO reads (torch and numpy only; no verl import here).

Layout, as verl's rollout produces it: prompts left-padded to `max_prompt_length`,
responses right-padded to `max_response_length`, `input_ids` their concatenation.
The reward sits on the last valid response token of `token_level_scores`.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from .aggregate import Limits, Row


def _left_pad(ids: Sequence[int], length: int, pad: int) -> Tuple[List[int], List[int]]:
    # Over-long prompts keep their last tokens: the ones nearest the response. Such rows are
    # marked `is_drop` and never trained on; this only gives them a shape.
    ids = list(ids[-length:])
    n_pad = length - len(ids)
    return [pad] * n_pad + ids, [0] * n_pad + [1] * len(ids)


def _right_pad(values: Sequence, length: int, pad) -> List:
    values = list(values[:length])
    return values + [pad] * (length - len(values))


def rows_to_tensors(rows: Sequence[Row], limits: Limits, pad_token_id: int) -> Dict[str, torch.Tensor]:
    """The tensor batch of `rows`, shapes `[B, P]` / `[B, R]` / `[B, P + R]` with P, R the limits.

    Keys: `prompts`, `responses`, `input_ids`, `attention_mask`, `position_ids`,
    `response_mask`, `token_level_scores` (float32: reward at index len(response) - 1),
    `is_drop_mask` (bool, `[B]`), and `rollout_log_probs` (float32) when every row has logprobs.
    `position_ids[b, t] = max(cumsum(attention_mask[b])[t] - 1, 0)`.
    """
    if not rows:
        raise ValueError("cannot build a training batch from zero rows")
    p_len, r_len = limits.max_prompt_length, limits.max_response_length
    prompts, prompt_attention, responses, response_attention, masks = [], [], [], [], []
    for row in rows:
        if not row.response_ids:
            raise ValueError(f"row {row.rollout_id}/{row.turn_index} has no response tokens")
        ids, attention = _left_pad(row.prompt_ids, p_len, pad_token_id)
        prompts.append(ids)
        prompt_attention.append(attention)
        responses.append(_right_pad(row.response_ids, r_len, pad_token_id))
        n_response = min(len(row.response_ids), r_len)
        response_attention.append([1] * n_response + [0] * (r_len - n_response))
        masks.append(_right_pad(row.response_mask, r_len, 0))

    prompts_t = torch.tensor(prompts, dtype=torch.long)
    responses_t = torch.tensor(responses, dtype=torch.long)
    attention_mask = torch.cat(
        [torch.tensor(prompt_attention, dtype=torch.long), torch.tensor(response_attention, dtype=torch.long)], dim=-1
    )
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0)

    scores = torch.zeros((len(rows), r_len), dtype=torch.float32)
    last = torch.tensor([min(len(row.response_ids), r_len) - 1 for row in rows])
    scores[torch.arange(len(rows)), last] = torch.tensor([row.reward for row in rows], dtype=torch.float32)

    tensors = {
        "prompts": prompts_t,
        "responses": responses_t,
        "input_ids": torch.cat([prompts_t, responses_t], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": torch.tensor(masks, dtype=torch.long),
        "token_level_scores": scores,
        "is_drop_mask": torch.tensor([row.is_drop for row in rows], dtype=torch.bool),
    }
    if all(row.logprobs is not None for row in rows):
        tensors["rollout_log_probs"] = torch.tensor(
            [_right_pad(row.logprobs, r_len, 0.0) for row in rows], dtype=torch.float32
        )
    return tensors


def rows_to_non_tensors(rows: Sequence[Row]) -> Dict[str, np.ndarray]:
    """The per-row non-tensor fields: `uid` (the prompt group), `rollout_id`, `turn_index`."""
    return {
        "uid": np.array([row.uid for row in rows], dtype=object),
        "rollout_id": np.array([row.rollout_id for row in rows], dtype=object),
        "turn_index": np.array([row.turn_index for row in rows], dtype=object),
    }
