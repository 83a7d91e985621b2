"""A prompt rebuilt from the model's own ids (`agl_proxy/chain/rebuild.py`), on a toy byte-level vocabulary
shaped like Qwen3's: the template's rendering, with the ids the parent call was given and sampled wherever they
spell the same text, shown by the engine's `/detokenize`."""

from __future__ import annotations

from agl_proxy.chain.rebuild import rebuild

VOCAB = {
    1: b"<|im_start|>assistant\n",
    2: b"<think>",
    3: b"\nThe user wants Paris.\n",
    4: b"</think>",
    5: b"\n\n",
    6: b"Sun",
    7: b"ny",
    8: b"Sunny",
    9: b".",
    10: b"<|im_end|>",
    11: b"\n",
    12: b"<|im_start|>user\nAnd tomorrow?",
    13: b'{"city":"Paris"}',
    14: b'{"city": "Paris"}',
    15: b"\xc3",  # "é" as two ids, one byte each; alone, each reads U+FFFD
    16: b"\xa9",
    17: b"\xa8",  # after b"\xc3": "è"
}
CLOSE, CLOSE_TEXT = (10, 11), "<|im_end|>"
NEW_TURN = [10, 11, 12, 10, 11, 1]
"""The answer's close, the new user turn, the next assistant header."""


async def detokenize(ids: list[int]) -> str:
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


async def refused(ids: list[int]) -> None:
    return None


async def test_the_template_s_rendering_keeps_the_sampled_content_and_drops_the_think_block() -> None:
    # The parent was given the header (1) and sampled its reasoning, then "Sunny." as "Sun" + "ny".
    seen = [1, 2, 3, 4, 5, 6, 7, 9, 10]
    # A new user turn: the template drops the think block and writes the content, which re-tokenizes as "Sunny".
    rendered = [1, 8, 9, *NEW_TURN]
    assert await rebuild(rendered, seen, CLOSE, CLOSE_TEXT, detokenize) == [1, 6, 7, 9, *NEW_TURN]


async def test_what_the_template_writes_otherwise_is_the_template_s() -> None:
    # The model wrote the tool call's arguments without a space; the template writes them with one.
    seen = [1, 2, 3, 4, 5, 13, 10]
    rendered = [1, 14, *NEW_TURN]
    assert await rebuild(rendered, seen, CLOSE, CLOSE_TEXT, detokenize) == rendered


async def test_ids_that_each_hold_part_of_a_character_are_not_taken_by_their_text() -> None:
    # "é" sampled, "è" rendered: their second bytes alone both read U+FFFD, so their texts would seem the same.
    seen = [1, 2, 3, 4, 5, 15, 16, 10]
    rendered = [1, 15, 17, *NEW_TURN]
    assert await rebuild(rendered, seen, CLOSE, CLOSE_TEXT, detokenize) == rendered


async def test_nothing_is_rebuilt_where_the_engine_does_not_detokenize() -> None:
    seen = [1, 2, 3, 4, 5, 6, 7, 9, 10]
    assert await rebuild([1, 8, 9, *NEW_TURN], seen, CLOSE, CLOSE_TEXT, refused) is None
