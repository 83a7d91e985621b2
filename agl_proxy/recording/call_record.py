"""What the proxy records of one LLM call, and the span it becomes.

The span's name and attribute names are `agl_store.call_span` (docs/spans.md describes them);
this module fills them in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agl_store import call_span
from agl_store.call_span import CallChain, CallChoice, CallError
from agl_store.models import Span, TraceStatus, new_span_id

from ..common.deployments import Deployment
from ..common.errors import ProxyError
from ..controls.sampling import SAMPLING_FIELDS

OPERATION_APIS = {"chat": "chat.completions", "text_completion": "completions"}
"""The `agl.api` of a call made in the operation's own OpenAI API."""


@dataclass
class CallRecord:
    """What the proxy learned about one call, filled in as the call goes."""

    operation: str
    """`chat` or `text_completion`."""
    rollout_id: str
    attempt_id: str
    requested_model: str | None
    stream: bool
    start_time: float
    """Wall-clock seconds since the epoch, when the request arrived."""
    deployment: Deployment | None = None
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    status_code: int = 0
    ttft_s: float | None = None
    latency_s: float = 0.0
    error: CallError | None = None
    sampling_mode: str | None = None
    """The rollout mode whose sampling the proxy enforced on the call, if any."""
    row: dict[str, int] | None = None
    """Under a row budget, from the token chain: `max_tokens` (the cap the engine got), `row_tokens`, `row_used`."""
    token_ids: tuple[str, str | None] | None = None
    """(status, cause) once `check_token_ids()` ran: `ok`, `missing` or `mismatch`, and why."""
    extra: dict[str, Any] = field(default_factory=dict)
    client_request: dict[str, Any] | None = None
    """A translated call's request in the client's own API (`request` is the chat request sent)."""
    api: str | None = None
    """The client's API (`responses`, `messages`) when it is not the operation's own."""
    tools_left_out: list[str] = field(default_factory=list)
    """A translated call's: the types of its tools the model was not shown (hosted / server tools)."""
    span_id: str = field(default_factory=new_span_id)
    """The id its span will have: a later call's chain names it as its parent."""
    chain: CallChain | None = None
    """How the prompt was made (the token chain); None: rendered by the backend."""
    segments: dict[int, list[tuple[str | None, int]]] | None = None
    """From the token chain, per choice index: the (model version, number of tokens) that sampled
    its tokens, in order, summing to the choice's `token_ids`; None: not served by the chain."""

    def fail(self, error_type: str, message: str, status_code: int) -> None:
        self.error = {"type": error_type, "message": message, "status_code": status_code}
        self.status_code = status_code

    def fail_with(self, error: ProxyError) -> None:
        """Record a proxy error as the call's outcome."""
        self.fail(error.code, error.message, error.status_code)

    @property
    def answered(self) -> bool:
        """The backend answered the call successfully (so far as the proxy knows)."""
        return self.error is None and 200 <= self.status_code < 300 and self.response is not None

    def check_token_ids(self) -> tuple[str, str | None] | None:
        """The token-id status of an answered call (kept in `token_ids`); None for a failed one."""
        if self.token_ids is None and self.answered:
            assert self.response is not None
            self.token_ids = token_ids_status(self.response, self.request or {})
        return self.token_ids


def token_ids_status(response: dict[str, Any], request: dict[str, Any]) -> tuple[str, str | None]:
    """(`ok` | `missing` | `mismatch`, cause) of an answer: are the prompt's and every choice's
    token ids there, and as many as the backend's usage counts (when it sent usage)?"""
    prompt_ids = _prompt_token_ids(response)
    choices = response.get("choices") or []
    if prompt_ids is None:
        return "missing", "no prompt_token_ids in the backend's answer"
    if not choices:
        return "missing", "no choices in the backend's answer"
    # An assembled stream has an empty list where the backend sent no ids: missing when text came.
    lacking = [c.get("index", i) for i, c in enumerate(choices) if not c.get("token_ids") and _generated(c)]
    if lacking:
        return "missing", f"no token_ids for choice(s) {lacking[:5]} in the backend's answer"
    usage = response.get("usage") or {}
    prompt_tokens = usage.get("prompt_tokens")
    # A batch of prompts (completions) counts all of them in usage; only one prompt's ids are kept.
    one_prompt = "messages" in request or not _is_batch(request.get("prompt"))
    if one_prompt and isinstance(prompt_tokens, int) and prompt_tokens != len(prompt_ids):
        return "mismatch", f"{len(prompt_ids)} prompt token ids but usage.prompt_tokens is {prompt_tokens}"
    completion_tokens = usage.get("completion_tokens")
    generated = sum(len(c.get("token_ids") or ()) for c in choices)
    if isinstance(completion_tokens, int) and completion_tokens != generated:
        return "mismatch", f"{generated} response token ids but usage.completion_tokens is {completion_tokens}"
    return "ok", None


def _generated(choice: dict[str, Any]) -> bool:
    """The choice carries output (or says nothing of it: ids were due either way)."""
    if choice.get("token_ids") is None:
        return True
    message = choice.get("message") or {}
    return any((choice.get("text"), *(message.get(k) for k in ("content", "tool_calls", "reasoning_content"))))


def _is_batch(prompt: Any) -> bool:
    """A completions `prompt` that holds several prompts (strings or token-id lists)."""
    return isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int)


def _choice_logprobs(choice: dict[str, Any]) -> list[float | None] | None:
    logprobs = choice.get("logprobs")
    if not logprobs:
        return None
    if isinstance(logprobs.get("content"), list):
        return [entry.get("logprob") for entry in logprobs["content"]]
    if isinstance(logprobs.get("token_logprobs"), list):
        return list(logprobs["token_logprobs"])
    return None


def _choices(response: dict[str, Any], segments: dict[int, list[tuple[str | None, int]]] | None) -> list[CallChoice]:
    """The span's `CHOICES`; `segments` is `CallRecord.segments`."""
    out: list[CallChoice] = []
    for choice in response.get("choices") or ():
        index = choice.get("index", 0)
        entry: CallChoice = {
            "index": index,
            "token_ids": choice.get("token_ids"),
            "logprobs": _choice_logprobs(choice),
            "finish_reason": choice.get("finish_reason"),
        }
        if choice.get("prompt_token_ids") is not None:
            entry["prompt_token_ids"] = choice["prompt_token_ids"]
        if segments is not None and index in segments:
            entry["segments"] = [[version, n] for version, n in segments[index]]  # JSON pairs, not tuples
        out.append(entry)
    return out


def _prompt_token_ids(response: dict[str, Any]) -> list[int] | None:
    # Chat responses carry them at the top level; completions per choice (one prompt each).
    if response.get("prompt_token_ids") is not None:
        return response["prompt_token_ids"]
    for choice in response.get("choices") or ():
        if choice.get("prompt_token_ids") is not None:
            return choice["prompt_token_ids"]
    return None


def llm_call_attributes(record: CallRecord) -> dict[str, Any]:
    """The attributes of a finished call's span (`agl_store.call_span` names them)."""
    response = record.response or {}
    choices = _choices(response, record.segments)
    prompt_ids = _prompt_token_ids(response)
    usage = response.get("usage") or {}
    input_tokens = usage.get("prompt_tokens")
    output_tokens = usage.get("completion_tokens")
    # Streams carry no usage unless the client asked for it; the token ids say the same.
    if input_tokens is None and prompt_ids is not None:
        input_tokens = len(prompt_ids)
    if output_tokens is None and choices:
        lengths = [len(ids) for c in choices if (ids := c["token_ids"]) is not None]
        if len(lengths) == len(choices):
            output_tokens = sum(lengths)
    deployment = record.deployment
    return {
        call_span.OPERATION: record.operation,
        call_span.SYSTEM: deployment.system if deployment else None,
        call_span.REQUEST_MODEL: record.requested_model,
        call_span.RESPONSE_MODEL: response.get("model"),
        call_span.INPUT_TOKENS: input_tokens,
        call_span.OUTPUT_TOKENS: output_tokens,
        call_span.REQUEST: record.request if record.client_request is None else record.client_request,
        call_span.RESPONSE: record.response,
        call_span.PROMPT_TOKEN_IDS: prompt_ids,
        call_span.CHOICES: choices,
        call_span.STREAM: record.stream,
        call_span.BACKEND: deployment.label if deployment else None,
        call_span.MODEL_VERSION: deployment.model_version if deployment else None,
        call_span.LATENCY_S: record.latency_s,
        call_span.TTFT_S: record.ttft_s,
        call_span.ERROR: record.error,
        **_sampling_attributes(record),
        **_token_id_attributes(record),
        call_span.API: record.api or OPERATION_APIS.get(record.operation),
        **({call_span.TOOLS_LEFT_OUT: record.tools_left_out} if record.tools_left_out else {}),
        call_span.CHAIN: record.chain or _rendered(record),
        **record.extra,
    }


def _rendered(record: CallRecord) -> CallChain:
    """The chain of a call the backend rendered itself: a completions prompt, or no token-in endpoints."""
    cause = "completions_api" if record.operation == "text_completion" else "backend_renders"
    return {"prompt": "rendered", "parent": None, "choice": None, "cause": cause}


def _sampling_attributes(record: CallRecord) -> dict[str, Any]:
    sent = record.request or {}
    sampling = {name: sent[name] for name in SAMPLING_FIELDS if sent.get(name) is not None}
    if "max_tokens" not in sampling and sent.get("max_completion_tokens") is not None:
        sampling["max_tokens"] = sent["max_completion_tokens"]
    if record.row is not None:
        sampling.update(record.row)
    out: dict[str, Any] = {call_span.SAMPLING: sampling}
    if record.sampling_mode is not None:
        out[call_span.SAMPLING_MODE] = record.sampling_mode
    return out


def _token_id_attributes(record: CallRecord) -> dict[str, Any]:
    checked = record.check_token_ids()
    if checked is None:
        return {}
    status, cause = checked
    out = {call_span.TOKEN_IDS_STATUS: status}
    if cause is not None:
        out[call_span.TOKEN_IDS_CAUSE] = cause
    return out


def build_llm_span(record: CallRecord, sequence_id: int | None = None) -> Span:
    """The span of a finished call; `sequence_id` None lets the store issue one."""
    error = record.error
    status = TraceStatus(status_code="OK")
    if error is not None:
        status = TraceStatus(status_code="ERROR", description=error["message"])
    return Span(
        span_id=record.span_id,
        rollout_id=record.rollout_id,
        attempt_id=record.attempt_id,
        sequence_id=sequence_id,
        name=call_span.NAME,
        start_time=record.start_time,
        end_time=record.start_time + record.latency_s,
        status=status,
        attributes=llm_call_attributes(record),
    )
