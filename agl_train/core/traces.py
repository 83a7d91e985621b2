"""Reading a finished rollout: spans of its latest attempt → LLM calls and a final reward.

The input is the span schema of `agl_store.call_span` and `agl_store.models.reward_span`
(docs/spans.md): `agl.llm_call` spans carry `agl.prompt_token_ids` and per choice
`agl.choices[i].token_ids` / `.logprobs` / `.segments`; `agl.reward` spans carry `agl.reward.value`, and the
last one of an attempt is the final reward.

Calls that cannot become training data (the backend failed, or no token ids were recorded)
are skipped and counted by reason, never turned into empty rows: an empty row would still
carry the rollout's reward and shift its advantage.
"""

from __future__ import annotations

import functools
import logging
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agl_store import call_span
from agl_store.base import LightningStore
from agl_store.models import REWARD_SPAN_NAME, REWARD_VALUE_ATTRIBUTE, Span
from agl_store.packed_attributes import MIN_PACKED_LENGTH

from .versions import Segments, joined, segments_of, version_of

logger = logging.getLogger(__name__)

AGL_03_PRIMARY_REWARD = "agentlightning.reward.0.value"
"""Where agent-lightning 0.3's `emit_reward` puts the primary reward (flattened OTLP attribute)."""

TRAINER_ATTRIBUTES = (
    call_span.PROMPT_TOKEN_IDS,
    call_span.CHOICES,
    call_span.SAMPLING,
    call_span.TOKEN_IDS_STATUS,
    call_span.CHAIN,
    call_span.MODEL_VERSION,
    REWARD_VALUE_ATTRIBUTE,
    AGL_03_PRIMARY_REWARD,
)
"""The span attributes a trace is built from (`read_rollout` asks the store for these only:
the request and response bodies, most of a stored call, are not read)."""

SKIP_ERROR = "error"
"""The call's span has status ERROR: the backend did not answer it."""
SKIP_NO_PROMPT_IDS = "no_prompt_token_ids"
"""The span has no `agl.prompt_token_ids` (e.g. a provider that does not return token ids)."""
SKIP_NO_RESPONSE_IDS = "no_response_token_ids"
"""A choice has no (or empty) `token_ids`: nothing was generated that could be trained."""
SKIP_TOKEN_IDS_MISMATCH = "token_ids_mismatch"
"""The proxy found more or fewer ids than the backend's usage counts (`agl.token_ids.status`
`mismatch`): the ids may not be the tokens that were sampled."""


@dataclass(frozen=True)
class Chain:
    """How the proxy made the call's prompt (`agl.chain`, a `call_span.CallChain`; see `call_graph`)."""

    prompt: str
    """`bridged`, `retry`, `branched` or `rendered`."""
    parent: str | None = None
    """The span id of the call this one continues (bridged, retry) or branched from."""
    choice: int | None = None
    """Which of the parent's choices (its `index`) a bridged call continues."""
    cause: str | None = None
    """Why a branched or rendered call was rendered whole (`first_call`, `history_edited`, ...)."""


def chain_of(value: Any) -> Chain | None:
    """The `Chain` an `agl.chain` attribute holds; None when absent or not shaped like one."""
    if not isinstance(value, dict) or not isinstance(prompt := value.get("prompt"), str):
        return None
    parent, choice, cause = value.get("parent"), value.get("choice"), value.get("cause")
    return Chain(
        prompt=prompt,
        parent=parent if isinstance(parent, str) else None,
        choice=choice if isinstance(choice, int) and not isinstance(choice, bool) else None,
        cause=cause if isinstance(cause, str) else None,
    )


@dataclass(frozen=True)
class LLMCall:
    """One generated choice of one LLM call, in token ids.

    Token ids are lists, or `array('i')` when the store client read them packed
    (`LightningStoreClient(token_arrays=True)`, what the trainer uses: no Python int per id).
    `logprobs` has one entry per response token, or is None when the call did not record them.
    A call with `n` choices becomes `n` LLMCalls sharing `sequence_id`.
    """

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    logprobs: list[float] | None = None
    sequence_id: int | None = None
    span_id: str = ""
    choice_index: int = 0
    finish_reason: str | None = None
    choice_position: int = 0
    """Where the choice sits in the span's `agl.choices` (`choice_index` is what it says)."""
    extends: tuple[str, int | None, int] | None = None
    """From a compact read (`call_span.DELTA`): (span id, choice position, n) of the call whose
    context's first n ids begin this prompt; the rest of the prompt is new."""
    sampling: Mapping[str, Any] | None = None
    """What the proxy sent the backend (`agl.sampling`: temperature, top_p, top_k, max_tokens), if recorded."""
    chain: Chain | None = None
    """How the proxy made the prompt (`agl.chain`); None on spans written before the proxy recorded it."""
    model_version: int | None = None
    """The weight version the call started on (`agl.model_version`, `versions.version_of`), if known."""
    segments: Segments | None = None
    """Which weight versions sampled the response's tokens, in order (`agl.choices[i].segments`,
    `versions.segments_of`); None when the span has none: every token is `model_version`'s."""

    @property
    def versions(self) -> Segments:
        """The version of each response token, as segments summing to `response_ids`."""
        if self.segments is not None:
            return self.segments
        return joined([(self.model_version, len(self.response_ids))])


@dataclass(frozen=True)
class RolloutTrace:
    """What the trainer needs from one finished rollout.

    `uid` is the prompt group the rollout belongs to (GRPO groups rollouts by it).
    `has_reward` is False when no reward span was found and `reward` is the fill value.
    `skipped` counts unusable calls by reason (`SKIP_*`).
    """

    rollout_id: str
    uid: str
    calls: list[LLMCall]
    reward: float
    has_reward: bool = True
    attempt_id: str = ""
    skipped: Mapping[str, int] = field(default_factory=dict)


def _sorted_by_sequence(spans: Iterable[Span]) -> list[Span]:
    # Spans from the store are already sorted; hand-built lists may not be. Spans without a
    # sequence number keep their relative order after the numbered ones.
    return sorted(spans, key=lambda s: (s.sequence_id is None, s.sequence_id or 0))


def _int_list(value: Any) -> Sequence[int] | None:
    if type(value) is array and value.typecode == "i":
        return value if value else None  # decoded from the store's int32 blobs: ints by construction
    if not isinstance(value, list) or not value:
        return None
    # `map(type, ...)` runs in C: the check costs little next to reading an 8k-token span.
    if not set(map(type, value)) <= {int}:
        return None
    return value


def _logprob_list(value: Any, n_tokens: int) -> list[float] | None:
    # A logprob list that does not line up with the tokens cannot be trusted position by
    # position, so it is dropped rather than padded.
    if not isinstance(value, list) or len(value) != n_tokens:
        return None
    types = set(map(type, value))
    if types <= {float}:
        return value
    if not types <= {float, int}:
        return None
    return list(map(float, value))


class _DeltaPrompts:
    """Whole prompt ids of the calls of a compact read (`query_spans(..., compact=True)`): a
    call with `call_span.DELTA` holds only what it adds to its parent's context."""

    def __init__(self, spans: Sequence[Span]) -> None:
        self._spans = {span.span_id: span for span in spans if span.name == call_span.NAME}
        self._prompts: dict[int, Sequence[int] | None] = {}  # by id(span): hand-built spans may share span ids

    def extends(self, span: Span) -> tuple[str, int | None, int] | None:
        delta = span.attributes.get(call_span.DELTA)
        if not isinstance(delta, dict) or not isinstance(delta.get("prefix"), int):
            return None
        return (delta["parent"], delta["choice"], delta["prefix"])

    def prompt(self, span: Span) -> Sequence[int] | None:
        """The span's whole prompt ids (as `_int_list` checks them), or None."""
        known = self._prompts.get(id(span), False)
        if known is not False:
            return known  # type: ignore[return-value]
        self._prompts[id(span)] = None  # a cycle (never written by a store) reads as no ids
        own = span.attributes.get(call_span.PROMPT_TOKEN_IDS)
        reference = self.extends(span)
        whole: Sequence[int] | None = None
        if reference is None:
            whole = _int_list(own)
        elif type(own) is array or isinstance(own, list):
            parent_id, choice, prefix = reference
            parent = self._spans.get(parent_id)
            if prefix == 0:
                # Nothing shared but request messages: the parent may be a failed call without ids.
                whole = _int_list(_joined([], [], 0, own))
            elif parent is not None and (parent_prompt := self.prompt(parent)) is not None:
                whole = _int_list(_joined(parent_prompt, _choice_ids(parent, choice), prefix, own))
        self._prompts[id(span)] = whole
        return whole


def _choice_ids(span: Span, position: int | None) -> Sequence[int]:
    choices = span.attributes.get(call_span.CHOICES)
    if position is None or not isinstance(choices, list) or not 0 <= position < len(choices):
        return []
    ids = choices[position].get("token_ids") if isinstance(choices[position], dict) else None
    return ids if type(ids) is array or isinstance(ids, list) else []


def _joined(prompt: Sequence[int], choice: Sequence[int], prefix: int, tail: Sequence[int]) -> Sequence[int]:
    """The first `prefix` ids of prompt + choice, then `tail`: an `array('i')` when the tail
    came as one (packed on the wire) and the result is long enough to have been packed, as a
    whole span's prompt would have come; else a list."""
    head = prompt[:prefix]
    rest = choice[: max(0, prefix - len(prompt))]
    if type(tail) is array and len(head) + len(rest) + len(tail) >= MIN_PACKED_LENGTH:
        joined = array("i", head) if type(head) is not array else head
        joined.extend(rest)
        joined.extend(tail)
        return joined
    return [*head, *rest, *tail]


def calls_from_spans(spans: Iterable[Span]) -> tuple[list[LLMCall], dict[str, int]]:
    """The trainable LLM calls among `spans`, in sequence order, and the skipped-call counts.

    Every choice of an `agl.llm_call` span with prompt and response token ids becomes one
    `LLMCall`. Spans with status ERROR and choices without token ids are counted under the
    `SKIP_*` reasons instead. Spans of other names are ignored.
    """
    calls: list[LLMCall] = []
    skipped: Counter[str] = Counter()
    ordered = _sorted_by_sequence(spans)
    prompts = _DeltaPrompts(ordered)
    for span in ordered:
        if span.name != call_span.NAME:
            continue
        if span.status.status_code == "ERROR":
            skipped[SKIP_ERROR] += 1
            continue
        attributes = span.attributes
        if attributes.get(call_span.TOKEN_IDS_STATUS) == "mismatch":
            skipped[SKIP_TOKEN_IDS_MISMATCH] += 1
            continue
        prompt_ids = prompts.prompt(span)
        if prompt_ids is None:
            skipped[SKIP_NO_PROMPT_IDS] += 1
            continue
        choices = attributes.get(call_span.CHOICES)
        if not isinstance(choices, list) or not choices:
            skipped[SKIP_NO_RESPONSE_IDS] += 1
            continue
        chain = chain_of(attributes.get(call_span.CHAIN))
        model_version = version_of(attributes.get(call_span.MODEL_VERSION))
        for position, choice in enumerate(choices):
            choice = choice if isinstance(choice, dict) else {}
            response_ids = _int_list(choice.get("token_ids"))
            if response_ids is None:
                skipped[SKIP_NO_RESPONSE_IDS] += 1
                continue
            segments = segments_of(choice.get("segments"), len(response_ids))
            if segments is None and "segments" in choice:
                _warn_unusable_segments()
            calls.append(
                LLMCall(
                    prompt_ids=prompt_ids,
                    response_ids=response_ids,
                    logprobs=_logprob_list(choice.get("logprobs"), len(response_ids)),
                    sequence_id=span.sequence_id,
                    span_id=span.span_id,
                    choice_index=choice["index"] if isinstance(choice.get("index"), int) else position,
                    finish_reason=choice.get("finish_reason"),
                    choice_position=position,
                    extends=prompts.extends(span),
                    sampling=sampling if isinstance(sampling := attributes.get(call_span.SAMPLING), dict) else None,
                    chain=chain,
                    model_version=model_version,
                    segments=segments,
                )
            )
    return calls, dict(skipped)


@functools.cache
def _warn_unusable_segments() -> None:
    # Once per process: a proxy that writes them wrong does so on every call, and the fallback
    # (the call's version for all its tokens) is what spans without segments get anyway.
    logger.warning(
        "an agl.choices entry has segments that are not [[version, n_tokens], ...] summing to its token_ids; "
        "its tokens get the call's agl.model_version (further such entries are not reported)"
    )


def reward_value(span: Span) -> float | None:
    """The reward a span records, or None: `agl.reward` spans (`agl.reward.value`), and spans
    of agent-lightning 0.3's `emit_reward` (`agentlightning.reward.0.value`, the primary reward).

    A value that is not a finite number does not count (it cannot be trained on).
    """
    if span.name == REWARD_SPAN_NAME:
        value = span.attributes.get(REWARD_VALUE_ATTRIBUTE)
    else:
        value = span.attributes.get(AGL_03_PRIMARY_REWARD)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def final_reward(spans: Iterable[Span]) -> float | None:
    """The last reward (see `reward_value`) in sequence order, or None if there is none."""
    reward: float | None = None
    for span in _sorted_by_sequence(spans):
        value = reward_value(span)
        if value is not None:
            reward = value
    return reward


def trace_from_spans(
    rollout_id: str,
    spans: Sequence[Span],
    *,
    uid: str | None = None,
    reward_fillna_value: float = 0.0,
    attempt_id: str = "",
) -> RolloutTrace:
    """Build a `RolloutTrace` from the spans of one attempt.

    `uid` defaults to the rollout id (each rollout its own group). A rollout without a reward
    span gets `reward_fillna_value`.
    """
    calls, skipped = calls_from_spans(spans)
    reward = final_reward(spans)
    return RolloutTrace(
        rollout_id=rollout_id,
        uid=uid if uid is not None else rollout_id,
        calls=calls,
        reward=reward if reward is not None else float(reward_fillna_value),
        has_reward=reward is not None,
        attempt_id=attempt_id,
        skipped=skipped,
    )


async def read_rollout(
    store: LightningStore,
    rollout_id: str,
    *,
    uid: str | None = None,
    reward_fillna_value: float = 0.0,
) -> RolloutTrace:
    """Read the spans of a rollout's latest attempt from `store` into a `RolloutTrace`.

    A rollout without attempts gives a trace with no calls (and the fill reward), so the
    trainer can still count it. Unknown rollouts raise the store's `NotFoundError`.
    """
    # One request: the latest attempt's spans name the attempt. Compact: a call stored as a
    # delta comes as its delta, and its prompt is rebuilt here from the parent's (in this same
    # read) by copying memory, not sent and parsed whole again.
    spans = await store.query_spans(rollout_id, "latest", compact=True, attributes=TRAINER_ATTRIBUTES)
    if spans:
        attempt_id = spans[0].attempt_id
    else:  # no spans yet, no attempt yet, or no such rollout (NotFoundError)
        attempt = await store.get_latest_attempt(rollout_id)
        if attempt is None:
            return trace_from_spans(rollout_id, [], uid=uid, reward_fillna_value=reward_fillna_value)
        attempt_id = attempt.attempt_id
        spans = await store.query_spans(rollout_id, attempt_id, compact=True, attributes=TRAINER_ATTRIBUTES)
    return trace_from_spans(rollout_id, spans, uid=uid, reward_fillna_value=reward_fillna_value, attempt_id=attempt_id)
