"""Why a trajectory's token prefix broke: where the contexts diverge and the likely cause.

In trajectory mode consecutive calls merge only while the next prompt starts with exactly
the previous prompt + response ids. When it does not, the rollout is split into more rows
than the agent had turns; the user can usually fix that in the agent, once they know why.
The causes worth telling apart:

- `template`: the chat template re-rendered earlier turns (e.g. it strips reasoning from
  past assistant messages, or a system prompt changed), so the prompts diverge before the
  previous response even starts.
- `retokenized`: the agent sent the previous response back as text and the server
  tokenized it differently (same text, other ids), so the divergence lies inside the
  previous response.
  A response whose bytes are not valid UTF-8 (a token cut a character in two) counts here
  too: its text cannot come back as the same bytes, let alone the same ids.
- `stop_token`: everything matched up to the previous response's last token, a special token
  that came back as another one: the model stopped with a stop token other than the one the
  template closes turns with (`<|endoftext|>` re-rendered as `<|im_end|>`).
- `truncation`: the agent shortened its history: the new prompt is a prefix of the old
  context, or shorter than the previous prompt.
- `other`: none of these (e.g. nothing shared at all: another conversation).

With a tokenizer the classification looks at text and special tokens; without one it uses
the divergence position alone (and never says `stop_token`: it cannot tell special tokens).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

KIND_TEMPLATE = "template"
KIND_RETOKENIZED = "retokenized"
KIND_STOP_TOKEN = "stop_token"
KIND_TRUNCATION = "truncation"
KIND_OTHER = "other"
BREAK_KINDS = (KIND_TEMPLATE, KIND_RETOKENIZED, KIND_STOP_TOKEN, KIND_TRUNCATION, KIND_OTHER)

_WINDOW = 8
"""Tokens shown on each side of the divergence in a break record: enough to spot a pattern."""


class Detokenizer(Protocol):
    """The part of a Hugging Face tokenizer the diagnosis uses."""

    all_special_ids: Collection[int]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class PrefixBreak:
    """One place where a rollout's calls could not be merged into the same row.

    `diverge_at` is the first index k where the previous context (prompt + response of the
    previous call) and the new prompt differ (= the shorter length when one is a prefix of
    the other). `context_window` / `prompt_window` show the tokens around k.
    """

    rollout_id: str
    turn_index: int
    diverge_at: int
    kind: str
    context_length: int
    prompt_length: int
    previous_prompt_length: int
    context_window: list[int]
    prompt_window: list[int]

    def describe(self) -> str:
        """A one-line explanation for logs."""
        return (
            f"rollout {self.rollout_id} call {self.turn_index}: prefix broke at token {self.diverge_at} "
            f"({self.kind}); previous context {self.context_length} tokens "
            f"(prompt {self.previous_prompt_length}), new prompt {self.prompt_length}; "
            f"context around it {self.context_window}, prompt around it {self.prompt_window}"
        )


def _equal(a: Sequence[int], b: Sequence[int]) -> bool:
    # Lists and arrays never compare equal to each other; a store read mixes them only for
    # arrays too short to be packed (< 8 ids), so the element-wise path stays short.
    if type(a) is type(b):
        return a == b
    return len(a) == len(b) and all(x == y for x, y in zip(a, b, strict=False))


def extends(prompt_ids: Sequence[int], previous_prompt: Sequence[int], previous_response: Sequence[int]) -> bool:
    """Whether `prompt_ids` starts with exactly `previous_prompt + previous_response` (no break)."""
    p, r = len(previous_prompt), len(previous_response)
    if len(prompt_ids) < p + r:
        return False
    # Compare from the end of the previous context first: a re-rendered prompt usually
    # differs near the last turn, so mismatches are found sooner. Arrays compare as memory.
    return _equal(prompt_ids[p : p + r], previous_response) and _equal(prompt_ids[:p], previous_prompt)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index where `a` and `b` differ; the shorter length if one is a prefix of the other."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def classify_break(
    previous_prompt: Sequence[int],
    previous_response: Sequence[int],
    prompt: Sequence[int],
    tokenizer: Detokenizer | None = None,
) -> str:
    """The likely cause (`BREAK_KINDS`) of `prompt` not starting with `previous_prompt + previous_response`."""
    context = list(previous_prompt) + list(previous_response)
    return _classify(context, first_divergence(context, prompt), len(previous_prompt), prompt, tokenizer)


def _classify(
    context: list[int], k: int, previous_prompt_length: int, prompt: Sequence[int], tokenizer: Detokenizer | None
) -> str:
    # Takes the context and its divergence `k` already computed, so `diagnose_break` builds them once.
    if k == 0:
        # Not one shared token: a different conversation (a sub-agent, a fresh system prompt).
        return KIND_OTHER
    if k == len(prompt) < len(context) or len(prompt) < previous_prompt_length:
        # Shorter than what the model already saw: the agent dropped part of its history.
        return KIND_TRUNCATION
    if tokenizer is not None:
        return _classify_with_tokenizer(context, k, previous_prompt_length, prompt, tokenizer)
    return KIND_RETOKENIZED if k >= previous_prompt_length else KIND_TEMPLATE


def _classify_with_tokenizer(
    context: list[int], k: int, previous_prompt_length: int, prompt: Sequence[int], tokenizer: Detokenizer
) -> str:
    special = set(tokenizer.all_special_ids)
    if k == len(context) - 1 >= previous_prompt_length and context[k] in special and prompt[k] in special:
        return KIND_STOP_TOKEN
    if k >= previous_prompt_length and "\ufffd" in tokenizer.decode(context[previous_prompt_length:]):
        # Bytes that are not UTF-8 became U+FFFD in the text the agent got back (or were held back
        # as an unfinished character): the same text cannot give the same ids.
        return KIND_RETOKENIZED
    context_specials = [t for t in context if t in special]
    prompt_specials = [t for t in prompt if t in special][: len(context_specials)]
    if context_specials != prompt_specials:
        return KIND_TEMPLATE
    context_text = tokenizer.decode(context, skip_special_tokens=False)
    prompt_text = tokenizer.decode(list(prompt), skip_special_tokens=False)
    if prompt_text.startswith(context_text):
        return KIND_RETOKENIZED
    return KIND_OTHER


def diagnose_break(
    rollout_id: str,
    turn_index: int,
    previous_prompt: Sequence[int],
    previous_response: Sequence[int],
    prompt: Sequence[int],
    tokenizer: Detokenizer | None = None,
) -> PrefixBreak:
    """A `PrefixBreak` record for call `turn_index` of a rollout, whose prompt broke the prefix."""
    context = list(previous_prompt) + list(previous_response)
    k = first_divergence(context, prompt)
    return PrefixBreak(
        rollout_id=rollout_id,
        turn_index=turn_index,
        diverge_at=k,
        kind=_classify(context, k, len(previous_prompt), prompt, tokenizer),
        context_length=len(context),
        prompt_length=len(prompt),
        previous_prompt_length=len(previous_prompt),
        context_window=context[max(k - _WINDOW, 0) : k + _WINDOW],
        prompt_window=list(prompt[max(k - _WINDOW, 0) : k + _WINDOW]),
    )
