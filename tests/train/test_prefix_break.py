"""Diagnosing a broken prefix: where the contexts diverge and why."""

from __future__ import annotations

import pytest

from agl_train.core.prefix_break import classify_break, diagnose_break, first_divergence


def test_first_divergence_is_the_first_differing_index_or_the_shorter_length() -> None:
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], [1]) == 0


def test_without_a_tokenizer_the_divergence_position_decides() -> None:
    previous_prompt, previous_response = [1, 2, 3, 4], [5, 6]
    # Earlier turns changed (before the previous response): the template re-rendered them.
    assert classify_break(previous_prompt, previous_response, [1, 2, 7, 4, 5, 6, 8]) == "template"
    # The previous answer came back with other ids: it was re-tokenized.
    assert classify_break(previous_prompt, previous_response, [1, 2, 3, 4, 5, 9, 8]) == "retokenized"
    # The history got shorter.
    assert classify_break(previous_prompt, previous_response, [1, 2, 3, 4, 5]) == "truncation"
    assert classify_break(previous_prompt, previous_response, [1, 2, 8]) == "truncation"
    # Nothing in common: another conversation.
    assert classify_break(previous_prompt, previous_response, [9, 9, 9, 9, 9, 9, 9]) == "other"


@pytest.fixture(scope="module")
def tokenizer():
    """A real (tiny) fast tokenizer where "ab" has two tokenizations: [a, b] and [ab]."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1, "a": 2, "b": 3, "ab": 4, "c": 5, "d": 6}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    core.add_special_tokens(["<s>", "</s>"])
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>")


def test_with_a_tokenizer_same_text_with_other_ids_is_retokenized(tokenizer) -> None:
    # The model generated "a" "b"; the agent sent "ab" back as text, which tokenizes to [ab].
    previous_prompt, previous_response = [0, 5], [2, 3, 1]
    prompt = [0, 5, 4, 1, 6]
    assert tokenizer.decode(previous_prompt + previous_response) == tokenizer.decode(prompt[:4]) == "<s>cab</s>"
    assert classify_break(previous_prompt, previous_response, prompt, tokenizer) == "retokenized"


def test_with_a_tokenizer_changed_special_tokens_are_the_template(tokenizer) -> None:
    # The template dropped the end-of-turn token after the previous answer.
    previous_prompt, previous_response = [0, 5], [2, 1]
    assert classify_break(previous_prompt, previous_response, [0, 5, 2, 6, 6], tokenizer) == "template"


def test_with_a_tokenizer_other_text_is_other(tokenizer) -> None:
    assert classify_break([0, 5], [2, 1], [0, 5, 3, 1, 6], tokenizer) == "other"


def test_a_break_record_shows_the_tokens_around_the_divergence() -> None:
    record = diagnose_break("ro-1", 3, list(range(20)), [20, 21], list(range(10)) + [99] + list(range(11, 22)))

    assert (record.rollout_id, record.turn_index, record.diverge_at, record.kind) == ("ro-1", 3, 10, "template")
    assert record.context_window == list(range(2, 18))
    assert record.prompt_window == list(range(2, 10)) + [99] + list(range(11, 18))
    assert (record.context_length, record.prompt_length, record.previous_prompt_length) == (22, 22, 20)
