"""Rows → padded tensors: layout, masks, reward placement, logprobs."""

from __future__ import annotations

import pytest
import torch

from agl_train.algo.tensorize import rows_to_non_tensors, rows_to_tensors
from agl_train.core.aggregate import Limits, Row

PAD = 0
LIMITS = Limits(max_prompt_length=4, max_response_length=5)


def row(prompt, response, mask=None, logprobs=None, reward=1.0, rollout_id="ro-1", turn_index=0, is_drop=False) -> Row:
    return Row(
        rollout_id=rollout_id,
        uid="g",
        turn_index=turn_index,
        prompt_ids=list(prompt),
        response_ids=list(response),
        response_mask=list(mask if mask is not None else [1] * len(response)),
        logprobs=logprobs,
        reward=reward,
        is_drop=is_drop,
    )


def test_prompts_are_left_padded_responses_right_padded_and_concatenated() -> None:
    t = rows_to_tensors([row([7, 8], [9, 10, 11], mask=[1, 0, 1])], LIMITS, PAD)

    assert t["prompts"].tolist() == [[0, 0, 7, 8]]
    assert t["responses"].tolist() == [[9, 10, 11, 0, 0]]
    assert t["input_ids"].tolist() == [[0, 0, 7, 8, 9, 10, 11, 0, 0]]
    assert t["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1, 1, 0, 0]]
    assert t["position_ids"].tolist() == [[0, 0, 0, 1, 2, 3, 4, 4, 4]]
    assert t["response_mask"].tolist() == [[1, 0, 1, 0, 0]]
    assert t["is_drop_mask"].tolist() == [False]


def test_every_padded_place_holds_the_pad_token_in_rows_of_lists_and_of_arrays() -> None:
    from array import array

    lists = [row([7, 8], [9, 10, 11]), row([5, 6, 7, 8, 9], [4])]
    arrays = [
        Row(**{**vars(r), "prompt_ids": array("i", r.prompt_ids), "response_ids": array("i", r.response_ids)})
        for r in lists
    ]
    for rows in (lists, arrays):
        t = rows_to_tensors(rows, LIMITS, pad_token_id=99)
        assert t["input_ids"].tolist() == [[99, 99, 7, 8, 9, 10, 11, 99, 99], [6, 7, 8, 9, 4, 99, 99, 99, 99]]
        assert t["prompts"].tolist() == [[99, 99, 7, 8], [6, 7, 8, 9]]
        assert t["responses"].tolist() == [[9, 10, 11, 99, 99], [4, 99, 99, 99, 99]]
        assert all(t[key].is_contiguous() for key in t)


def test_the_reward_sits_on_the_last_valid_response_token() -> None:
    t = rows_to_tensors([row([1], [2, 3], reward=0.5), row([1], [2, 3, 4, 5, 6], reward=-1.0)], LIMITS, PAD)

    assert t["token_level_scores"].dtype == torch.float32
    assert t["token_level_scores"].tolist() == [[0.0, 0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, -1.0]]


def test_rollout_log_probs_only_when_every_row_has_them() -> None:
    with_logprobs = row([1], [2, 3], logprobs=[-0.25, -0.5])

    t = rows_to_tensors([with_logprobs], LIMITS, PAD)
    assert t["rollout_log_probs"].tolist() == [[-0.25, -0.5, 0.0, 0.0, 0.0]]
    assert "rollout_log_probs" not in rows_to_tensors([with_logprobs, row([1], [2])], LIMITS, PAD)


def test_an_over_long_marked_prompt_keeps_its_last_tokens_for_shape() -> None:
    t = rows_to_tensors([row([1, 2, 3, 4, 5, 6], [7], is_drop=True)], LIMITS, PAD)

    assert t["prompts"].tolist() == [[3, 4, 5, 6]]
    assert t["is_drop_mask"].tolist() == [True]


def test_non_tensors_name_the_group_rollout_and_turn() -> None:
    nt = rows_to_non_tensors(
        [row([1], [2], rollout_id="ro-1", turn_index=0), row([1], [2], rollout_id="ro-2", turn_index=3)]
    )

    assert nt["uid"].tolist() == ["g", "g"]
    assert nt["rollout_id"].tolist() == ["ro-1", "ro-2"]
    assert nt["turn_index"].tolist() == [0, 3]


def test_zero_rows_or_an_empty_response_is_an_error() -> None:
    with pytest.raises(ValueError, match="zero rows"):
        rows_to_tensors([], LIMITS, PAD)
    with pytest.raises(ValueError, match="no response tokens"):
        rows_to_tensors([row([1], [])], LIMITS, PAD)
