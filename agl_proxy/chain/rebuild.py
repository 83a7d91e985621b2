"""A prompt rebuilt from the model's own ids where the chat template renders the history otherwise
than a bridge would keep it (Qwen3 drops earlier reasoning at a new user turn, the client did not
send an answer's reasoning back, a template rewrites what came before).

The prompt is the template's rendering of the whole request (`rendered`), with the ids the parent
call was given and sampled (`seen`: its prompt ids, then its answer's ids) wherever the template
writes the same text: an earlier answer's content and tool calls, which the template keeps, stay
the ids the model sampled (its prompt ids hold the earlier answers bridged in), not a
re-tokenized copy; what the template changes (a dropped think block, the headers and closes around
it) is the template's own ids.

How it is shown exact:

1. `seen` and `rendered` are aligned turn by turn, then id for id inside the turns that differ
   (`difflib`'s matching blocks): the matched ids are the same in both.
2. Each stretch where they differ is compared by text (each id's text from one `/detokenize`
   of the stretch's ids, each set between copies of the template's turn close, which splits them
   again): the longest run at its start and at its end that spells the same text in both, at a
   token boundary of both, is taken from `seen`; the rest from `rendered`.
3. The result is detokenized whole, and so is `rendered`: the two texts (as the engine's tokenizer
   decodes them) are equal, or nothing is rebuilt (the caller renders the call whole).

Step 3 is the proof; steps 1 and 2 only choose which ids to keep, so a tokenizer whose ids do not
decode one by one (a byte split across two ids reads as U+FFFD, and such ids are never taken from
`seen` by text) keeps fewer sampled ids, never a wrong prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from difflib import SequenceMatcher
from itertools import accumulate

REBUILT_CAUSES = frozenset({"template_drops_reasoning", "reasoning_dropped", "template_rewrites_history"})
"""Why a bridge was refused where the template renders the history otherwise: such a call's prompt is rebuilt."""
UNPROVEN = "rebuild_unproven"
"""The cause of a call whose rebuilt prompt could not be shown to be the template's text: rendered whole."""
Detokenize = Callable[[list[int]], Awaitable[str | None]]
"""The engine's `/detokenize` (`engine.detokenize`): the text of the ids, None where the engine cannot tell."""
_PART_BYTE = "\ufffd"
"""What an id that holds part of a character decodes to alone."""


async def rebuild(
    rendered: Sequence[int], seen: Sequence[int], close: Sequence[int], close_text: str, detokenize: Detokenize
) -> list[int] | None:
    """The template's rendering `rendered` with `seen`'s ids wherever they spell the same text;
    None where the result cannot be shown to decode to `rendered`'s text (the engine does not
    detokenize, or the texts differ). `close` is the template's turn close and `close_text` its
    text, stripped (`Engine`)."""
    rendered, seen = list(rendered), list(seen)
    stretches = _differing(seen, rendered, close[0]) if close else []
    found = await asyncio.gather(
        *(_kept(seen[ours], rendered[theirs], close, close_text, detokenize) for ours, theirs in stretches)
    )
    kept = [ids for ids in found if ids is not None]
    if len(kept) < len(found):
        return None
    out: list[int] = []
    done = 0
    for (_, theirs), ids in zip(stretches, kept, strict=True):
        out += rendered[done : theirs.start] + ids
        done = theirs.stop
    out += rendered[done:]
    if out == rendered:
        return out
    text, expected = await asyncio.gather(detokenize(out), detokenize(rendered))
    return out if text is not None and text == expected else None


def _differing(seen: list[int], rendered: list[int], end: int) -> list[tuple[slice, slice]]:
    """The stretches where `seen` and `rendered` differ and both hold ids, as slices of each.

    Aligned turn by turn first (each ends on `end`, the turn close's first id), then id by id
    inside the turns that differ: `difflib` on ids alone grows with the square of a long history."""
    seen_turns, rendered_turns = _turns(seen, end), _turns(rendered, end)
    turns = SequenceMatcher(
        None, [tuple(seen[t]) for t in seen_turns], [tuple(rendered[t]) for t in rendered_turns], autojunk=False
    )
    out = []
    for tag, a0, a1, b0, b1 in turns.get_opcodes():
        if tag != "replace":
            continue
        ours, theirs = seen_turns[a0].start, rendered_turns[b0].start
        ids = SequenceMatcher(
            None, seen[ours : seen_turns[a1 - 1].stop], rendered[theirs : rendered_turns[b1 - 1].stop], autojunk=False
        )
        out += [
            (slice(ours + i0, ours + i1), slice(theirs + j0, theirs + j1))
            for tag, i0, i1, j0, j1 in ids.get_opcodes()
            if tag == "replace"
        ]
    return out


def _turns(ids: list[int], end: int) -> list[slice]:
    """`ids` cut after each `end`."""
    starts = [0, *(at + 1 for at, i in enumerate(ids) if i == end)]
    if starts[-1] == len(ids):
        starts.pop()
    return [slice(start, stop) for start, stop in zip(starts, [*starts[1:], len(ids)], strict=True)]


async def _kept(
    seen: list[int], rendered: list[int], close: Sequence[int], close_text: str, detokenize: Detokenize
) -> list[int] | None:
    """One differing stretch: `seen`'s ids for its longest runs at the start and at the end that
    spell the same text as `rendered`'s there, `rendered`'s ids between (all of them where the
    ids' texts cannot be told apart); None where the engine does not detokenize."""
    ids = [*seen, *rendered]
    joined = list(close)
    for i in ids:
        joined += [i, *close]
    text = await detokenize(joined)
    if text is None:
        return None
    texts = _id_texts(text, len(ids), close_text)
    if texts is None:
        return rendered
    seen_texts, rendered_texts = texts[: len(seen)], texts[len(seen) :]
    head, rendered_head = _same_text_run(seen_texts, rendered_texts)
    tail, rendered_tail = _same_text_run(
        [t[::-1] for t in reversed(seen_texts[head:])], [t[::-1] for t in reversed(rendered_texts[rendered_head:])]
    )
    return seen[:head] + rendered[rendered_head : len(rendered) - rendered_tail] + seen[len(seen) - tail :]


def _id_texts(text: str, count: int, close_text: str) -> list[str] | None:
    """Each id's text, from the text of `count` ids each set between copies of the close; None
    where they cannot be told apart (an id's own text holds `close_text`: Mistral's `</s>` is its
    close, or the close's text is unknown)."""
    pieces = text.split(close_text) if close_text else []
    if len(pieces) != count + 2 or pieces[0]:
        return None
    # The close's text past `close_text` (Qwen's newline) starts every piece; the last piece is it alone.
    rest = pieces[-1]
    if not all(p.startswith(rest) for p in pieces[1:-1]):
        return None
    return [p[len(rest) :] for p in pieces[1:-1]]


def _same_text_run(one: Sequence[str], other: Sequence[str]) -> tuple[int, int]:
    """How many leading ids of each spell the same text, ending at a token boundary of both: the
    longest such run, none past an id that decodes to part of a character."""
    text_one, text_other = "".join(one), "".join(other)
    shared = 0
    while shared < min(len(text_one), len(text_other)) and text_one[shared] == text_other[shared]:
        shared += 1
    other_ends = {end: count for count, end in enumerate(_whole_ends(other), 1)}
    best = (0, 0)
    for count, end in enumerate(_whole_ends(one), 1):
        if end > shared:
            break
        if end in other_ends:
            best = (count, other_ends[end])
    return best


def _whole_ends(texts: Sequence[str]) -> list[int]:
    """The text offsets where each id ends, up to the first id that decodes to part of a character."""
    ends = []
    for end, text in zip(accumulate(len(t) for t in texts), texts, strict=True):
        if _PART_BYTE in text:
            break
        ends.append(end)
    return ends
