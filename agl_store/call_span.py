"""The span of one LLM call: its name and attribute names, written once.

The proxy writes these spans (`agl_proxy.recording.call_record`), the trainer reads them
(`agl_train.core.traces`) and the web view shows them (`agl_train.view`); all three spell the
names through this module. docs/spans.md describes each attribute for people. The reward
span, the other span agl defines, is `agl_store.models.reward_span`.

Import the module rather than its names, so a reader sees where a name comes from:
`attributes[call_span.PROMPT_TOKEN_IDS]`.
"""

from __future__ import annotations

from typing import TypedDict

NAME = "agl.llm_call"
"""The name of the span of one call to `/v1/chat/completions` or `/v1/completions` (any `n`, streamed or not)."""

# OpenTelemetry's GenAI attributes.
OPERATION = "gen_ai.operation.name"
"""`chat` or `text_completion`."""
SYSTEM = "gen_ai.system"
"""`vllm` for OpenAI-compatible vLLM deployments, else LiteLLM's provider name."""
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
"""Completion tokens, summed over choices."""

# agl's own: the bodies and the token ids the trainer needs.
REQUEST = "agl.request"
"""The request body as sent to the backend (never connection settings or credentials)."""
RESPONSE = "agl.response"
"""The response body; for a stream, the assembled non-stream equivalent."""
PROMPT_TOKEN_IDS = "agl.prompt_token_ids"
"""The prompt's token ids as the backend tokenized (or received) them: a list of ints."""
CHOICES = "agl.choices"
"""One `CallChoice` per generated choice."""
STREAM = "agl.stream"
BACKEND = "agl.backend"
"""The deployment that served the call (its `api_base`, without any `user:password@`)."""
MODEL_VERSION = "agl.model_version"
LATENCY_S = "agl.latency_s"
TTFT_S = "agl.ttft_s"
ERROR = "agl.error"
"""A `CallError` on failure (the span's status is then ERROR), else None."""
TOKEN_IDS_STATUS = "agl.token_ids.status"
"""On answered calls: `ok`, `missing` (prompt or a choice's ids absent) or `mismatch` (fewer or
more ids than the backend's usage counts). Absent on failed calls, but for one refused for its ids."""
TOKEN_IDS_CAUSE = "agl.token_ids.cause"
"""With `missing` or `mismatch`: why, in a short sentence."""
SAMPLING = "agl.sampling"
"""The effective temperature / top_p / top_k / max_tokens sent to the backend: an object with
only the keys someone (the agent, the deployment, the proxy) set. Under a row budget also
`row_tokens` (the budget) and, from the token chain, `row_used` (the row's tokens before the call),
`max_tokens` then being the cap the engine got."""
SAMPLING_MODE = "agl.sampling.mode"
"""The rollout mode whose sampling the proxy enforced on the call; absent when none applied."""
API = "agl.api"
"""The API the client called: `chat.completions`, `completions`, `responses` or `messages`."""
CHAIN = "agl.chain"
"""How the call's prompt was made: a `CallChain`. Absent on spans written before the chain existed."""
TOOLS_LEFT_OUT = "agl.tools_left_out"
"""A translated call's: the types of the request's tools the model was not shown (tools the API's
own servers run, e.g. `web_search`), in the request's order; absent when none were left out."""
DELTA = "agl.delta"
"""Only in spans read with `query_spans(..., compact=True)`: a `CallDelta` naming the earlier
call this one extends; `PROMPT_TOKEN_IDS` and the request's messages then hold only what it adds."""


class CallChoice(TypedDict, total=False):
    """One entry of `CHOICES`."""

    index: int
    token_ids: list[int] | None
    """The generated token ids; None when the backend returned none."""
    logprobs: list[float | None] | None
    """One per generated token, or None when the call did not ask for them."""
    finish_reason: str | None
    prompt_token_ids: list[int]
    """Completions only, when the backend sent the prompt's ids with the choice."""
    segments: list[list[str | int | None]]
    """`[[weight_version, n_tokens], ...]`: which weights sampled `token_ids` (and their `logprobs`), in
    sampling order, summing to `len(token_ids)`; several when the call went on across a weight update.
    Written by the token chain for every call it serves (one segment for a call served by one version);
    absent on spans without it (pass-through calls, older spans), where `MODEL_VERSION` is every token's
    version. `MODEL_VERSION` stays the version the call started on."""


class CallDelta(TypedDict):
    """The value of `DELTA`: this call's prompt ids are the first `prefix` ids of the parent's
    context (its prompt, then choice `choice`'s `token_ids`; the prompt alone when `choice` is
    None), then `PROMPT_TOKEN_IDS`; its request's messages are the parent's first `messages`,
    then its own. `prefix` is None for a call without prompt ids. Other places that held the
    whole prompt's ids (the response body's) are null."""

    parent: str
    """The parent call's span id, in the same attempt."""
    choice: int | None
    """A position in the parent's `CHOICES`."""
    prefix: int | None
    messages: int


class CallChain(TypedDict):
    """The value of `CHAIN`."""

    prompt: str
    """`bridged`: the parent's exact prompt ids + its choice's token ids + the template's turn close/glue + only the
    new messages rendered + the assistant opener (sampled tokens never re-rendered);
    `retry`: the same request as the parent's (its prompt ids reused as they are): a retry that replaced the parent
    or a sample beside it, which only the whole attempt tells apart (the trainer's call graph does);
    `branched`: rendered whole because the messages diverge from every earlier call of the attempt (`cause` says how);
    `rendered`: rendered whole with nothing to continue (the attempt's first call) or by a backend that cannot take
    token ids (`cause` says which)."""
    parent: str | None
    """The span id of the call this one continues (bridged, retry) or branched from (the call whose messages share
    the longest prefix with this one's; None when none shares any); None for rendered."""
    choice: int | None
    """Which of the parent's choices it continues (bridged); None otherwise."""
    cause: str | None
    """For branched / rendered (and a bridged call that kept reasoning): a short machine-readable cause, one of
    `first_call`, `backend_renders` (no token-in endpoints: LiteLLM provider, older vLLM, not enabled),
    `history_edited` (an earlier message changed), `history_shortened`, `answer_changed` (the echoed assistant message
    differs from the answer the proxy gave), `reasoning_dropped`, `system_changed`, `tools_changed`,
    `template_changed` (a field that changes the rendering besides the messages: chat_template_kwargs, ...),
    `template_boundary` (the engine's renderings did not show where the new messages start),
    `template_rewrites_history` (the template renders the history otherwise once the new messages follow),
    `template_drops_reasoning` (the template drops the reasoning since the last user message); with those two, and
    `reasoning_dropped` where the call continues its parent, the prompt is the template's rendering rebuilt from the
    model's own ids (the parent's prompt and answer ids wherever they spell the same text, shown by `/detokenize`),
    `rebuild_unproven` (the call continues its parent, but the template renders the history otherwise and the rebuilt
    prompt could not be shown to be its text: rendered whole), `multimodal` (it would be
    bridged, but a message holds media: rendered whole, generate gets the media's features),
    `completions_api` (prompt given as text/ids by the client), `row_full` (the prompt is bridged, but the parent's
    training row has no room left under the row budget, so this call starts a row); for bridged: `reasoning_kept` (the
    deployment keeps reasoning the template renders otherwise), else None; None for retry."""


class CallError(TypedDict):
    """The value of `ERROR` on a failed call."""

    type: str
    message: str
    status_code: int
