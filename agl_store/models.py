"""The store's data model: rollouts, attempts, spans, resources, workers.

Field names and JSON shapes follow the agent-lightning 0.3 types, so payloads of its
store server and clients validate here unchanged. Two deliberate differences:

- `Span.attributes` holds any JSON value: the LLM-call span keeps request, response and
  token-id arrays as native JSON, not flattened strings (docs/spans.md).
- `Span.sequence_id` may be omitted on input; the store then issues one.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .bounds import MAX_INTEGER

RolloutStatus = Literal["queuing", "preparing", "running", "succeeded", "failed", "cancelled", "requeuing"]
AttemptStatus = Literal["preparing", "running", "succeeded", "failed", "unresponsive", "timeout"]
RolloutMode = Literal["train", "val", "test"]
WorkerStatus = Literal["idle", "busy", "unknown"]
StatusCode = Literal["UNSET", "OK", "ERROR"]

ROLLOUT_STATUSES: tuple[RolloutStatus, ...] = (
    "queuing",
    "preparing",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "requeuing",
)
ATTEMPT_STATUSES: tuple[AttemptStatus, ...] = ("preparing", "running", "succeeded", "failed", "unresponsive", "timeout")
WORKER_STATUSES: tuple[WorkerStatus, ...] = ("idle", "busy", "unknown")
ROLLOUT_MODES: tuple[RolloutMode, ...] = ("train", "val", "test")

TERMINAL_ROLLOUT_STATUSES: frozenset[RolloutStatus] = frozenset({"succeeded", "failed", "cancelled"})
QUEUED_ROLLOUT_STATUSES: frozenset[RolloutStatus] = frozenset({"queuing", "requeuing"})
ACTIVE_ROLLOUT_STATUSES: frozenset[RolloutStatus] = frozenset({"preparing", "running"})

TaskInput = Any
LATEST_ATTEMPT = "latest"
"""The attempt id that names a rollout's latest attempt, wherever the store takes an attempt id."""


def new_id(prefix: str) -> str:
    """A short random id such as `ro-3f9a1c2b7d4e`: readable in logs, unique in practice."""
    return f"{prefix}-{secrets.token_hex(6)}"


# --- rollouts and attempts -------------------------------------------------------------


class RolloutConfig(BaseModel):
    """Retry and timeout policy of one rollout.

    `timeout_seconds` bounds one attempt's wall time from its start; `unresponsive_seconds`
    bounds the silence since the attempt's last heartbeat (any span is one). An attempt that
    ends `failed`, `timeout` or `unresponsive` requeues the rollout when its status is listed
    in `retry_condition` and fewer than `max_attempts` attempts were made; otherwise the
    rollout fails.
    """

    model_config = ConfigDict(extra="forbid")

    timeout_seconds: float | None = Field(default=None, gt=0)
    unresponsive_seconds: float | None = Field(default=None, gt=0)
    max_attempts: int = Field(default=1, ge=1, le=MAX_INTEGER)
    retry_condition: list[AttemptStatus] = Field(default_factory=list)


class Attempt(BaseModel):
    rollout_id: str
    attempt_id: str
    sequence_id: int
    """1 for the first attempt of a rollout, 2 for its first retry, and so on."""
    start_time: float
    end_time: float | None = None
    status: AttemptStatus = "preparing"
    worker_id: str | None = None
    last_heartbeat_time: float | None = None
    metadata: dict[str, Any] | None = None


class Rollout(BaseModel):
    rollout_id: str
    input: TaskInput
    start_time: float
    end_time: float | None = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    status: RolloutStatus = "queuing"
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] | None = None


class AttemptedRollout(Rollout):
    """A rollout together with the attempt a runner should execute (or the latest one)."""

    attempt: Attempt


class EnqueueRolloutRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: TaskInput
    mode: RolloutMode | None = None
    resources_id: str | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None
    idempotency_key: str | None = None
    """agl's addition: makes a retried enqueue safe (see `LightningStore`)."""


# --- workers ---------------------------------------------------------------------------


class Worker(BaseModel):
    worker_id: str
    status: WorkerStatus = "unknown"
    heartbeat_stats: dict[str, Any] | None = None
    last_heartbeat_time: float | None = None
    last_dequeue_time: float | None = None
    last_busy_time: float | None = None
    last_idle_time: float | None = None
    current_rollout_id: str | None = None
    current_attempt_id: str | None = None


# --- spans -----------------------------------------------------------------------------


class SpanContext(BaseModel):
    model_config = ConfigDict(extra="allow")

    trace_id: str
    span_id: str
    is_remote: bool = False
    trace_state: dict[str, str] = Field(default_factory=dict)


class TraceStatus(BaseModel):
    status_code: StatusCode = "UNSET"
    description: str | None = None


class Event(BaseModel):
    name: str
    attributes: dict[str, Any] = Field(default_factory=dict)
    timestamp: float | None = None


class Link(BaseModel):
    context: SpanContext
    attributes: dict[str, Any] | None = None


class OtelResource(BaseModel):
    attributes: dict[str, Any] = Field(default_factory=dict)
    schema_url: str = ""


def _new_trace_id() -> str:
    return secrets.token_hex(16)


def new_span_id() -> str:
    """A fresh span id (16 hex digits), as a span gets one by default."""
    return secrets.token_hex(8)


class Span(BaseModel):
    """One OpenTelemetry-shaped span of a rollout attempt.

    Times are seconds since the epoch. `attributes` values are any JSON value; arrays of
    ints (token ids) are stored compactly and come back as plain lists of ints.
    `sequence_id` orders the spans of a rollout; when it is None on input the store issues
    the next one.
    """

    model_config = ConfigDict(extra="allow")

    rollout_id: str
    attempt_id: str
    sequence_id: int | None = None
    trace_id: str = Field(default_factory=_new_trace_id)
    span_id: str = Field(default_factory=new_span_id)
    parent_id: str | None = None
    name: str
    status: TraceStatus = Field(default_factory=TraceStatus)
    attributes: dict[str, Any] = Field(default_factory=dict)
    events: list[Event] = Field(default_factory=list)
    links: list[Link] = Field(default_factory=list)
    start_time: float | None = None
    end_time: float | None = None
    context: SpanContext | None = None
    parent: SpanContext | None = None
    resource: OtelResource = Field(default_factory=OtelResource)


REWARD_SPAN_NAME = "agl.reward"
"""Name of a reward span; its `attributes["agl.reward.value"]` is a float, and the last one of an attempt
is the attempt's final reward (docs/spans.md)."""
REWARD_VALUE_ATTRIBUTE = "agl.reward.value"


def reward_span(rollout_id: str, attempt_id: str, value: float, **fields: Any) -> Span:
    """A span that records `value` as the reward of an attempt (the last one recorded wins)."""
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name=REWARD_SPAN_NAME,
        attributes={REWARD_VALUE_ATTRIBUTE: float(value)},
        **fields,
    )


# --- resources -------------------------------------------------------------------------


class LLM(BaseModel):
    """An LLM endpoint that rollouts call, with the sampling parameters to use."""

    resource_type: Literal["llm"] = "llm"
    endpoint: str
    model: str
    api_key: str | None = None
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)

    def get_base_url(self, rollout_id: str | None = None, attempt_id: str | None = None) -> str:
        return self.endpoint


class ProxyLLM(LLM):
    """An LLM reached through agl's proxy: each rollout gets its own base URL.

    `endpoint` is the proxy's OpenAI base URL (`http://host:8080/v1`); the per-rollout URL
    is `http://host:8080/rollout/{rollout_id}/attempt/{attempt_id}/v1`.
    """

    resource_type: Literal["proxy_llm"] = "proxy_llm"  # type: ignore[assignment]

    def get_base_url(self, rollout_id: str | None = None, attempt_id: str | None = None) -> str:
        if rollout_id is None and attempt_id is None:
            return self.endpoint
        if not rollout_id or not attempt_id:
            raise ValueError("get_base_url needs both rollout_id and attempt_id, or neither")
        root = self.endpoint.rstrip("/")
        has_v1 = root.endswith("/v1")
        if has_v1:
            root = root[: -len("/v1")]
        url = f"{root}/rollout/{rollout_id}/attempt/{attempt_id}"
        return url + "/v1" if has_v1 else url


class PromptTemplate(BaseModel):
    resource_type: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["jinja", "f-string", "poml"] = "f-string"


Resource = Annotated[LLM | ProxyLLM | PromptTemplate, Field(discriminator="resource_type")]
NamedResources = dict[str, Resource]


class ResourcesUpdate(BaseModel):
    resources_id: str
    create_time: float
    update_time: float
    version: int
    resources: NamedResources


# --- queries ---------------------------------------------------------------------------


class PaginatedResult(BaseModel):
    """The wire shape of every list route: one page of items plus the total match count."""

    items: Sequence[Any]
    limit: int
    offset: int
    total: int


class StoreStatistics(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    total_rollouts: int
    total_attempts: int
    total_spans: int
    total_resources: int
    total_workers: int
    rollouts_by_status: dict[str, int] = Field(default_factory=dict)
    uptime: float = 0.0
    database_bytes: int | None = None
    """Bytes on disk of the database file and its `-wal` file; None in memory."""
    wal_bytes: int | None = None
    """Of `database_bytes`, the `-wal` file's (truncated to 0 after retention)."""
    unused_bytes: int | None = None
    """Of the database file, free pages that later writes reuse."""
