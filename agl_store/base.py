"""The LightningStore contract.

Every method is async. Backends (`SQLiteStore` for both `sqlite://` files and `memory://`,
`LightningStoreClient` for `http://`) implement all of it and are run through one test
suite. Errors are the classes of `agl_store.errors`: an unknown id raises `NotFoundError`,
a bad value `InvalidInputError`, an illegal state change `ConflictError`.

Status rules, enforced by the backends:
- A rollout is `queuing` when enqueued; `dequeue_rollout` claims the oldest `queuing` or
  `requeuing` one (among those whose metadata matches, when a filter is given), creates an
  attempt (`preparing`) and moves the rollout to `preparing`.
- The first span or an explicit update moves attempt and rollout to `running`.
- The latest attempt's terminal status decides the rollout's: `succeeded` → `succeeded`;
  `failed` / `timeout` / `unresponsive` → `requeuing` when listed in
  `config.retry_condition` and `attempt.sequence_id < config.max_attempts`, else `failed`.
- The store itself marks attempts `timeout` (past `config.timeout_seconds` since the
  attempt started) and `unresponsive` (no heartbeat or span for `unresponsive_seconds`),
  from a background task, whether or not anyone calls it.
- A rollout in `succeeded`, `failed` or `cancelled` is finished (it has an `end_time`, and a
  late status report of its attempts leaves it so), yet it can run again, as in
  agent-lightning 0.3: `update_rollout(status="requeuing")` puts it back in the queue and
  `start_attempt` gives it a new attempt; it is then unfinished and follows that attempt.
- `attempt_id="latest"` names the rollout's latest attempt wherever an attempt id is taken.
- A create (`start_rollout`, `enqueue_rollout`, each item of `enqueue_many_rollouts`) may carry an
  `idempotency_key`: one the store has seen returns the rollout that create made, as it is now,
  instead of creating another, so a retried create is safe. The key names one create, whichever
  method made it; it is kept with the rollout (until the rollout is deleted).

The `query_*` methods take their filters, sorting and paging as keyword arguments and hand
them to the backend's `find_*` as one model of `agl_store.queries`, where each query's fields
are written once. Both return a `Page`: the items plus `total`, the match count before paging.

Features beyond agent-lightning's contract that the HTTP server relies on (`open`,
`add_packed_spans`, `find_span_rows`) are declared here with a default built on the rest of
the contract, so every backend has them; a backend overrides one where it can do better.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from .models import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    EnqueueRolloutRequest,
    NamedResources,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Span,
    StoreStatistics,
    TaskInput,
    Worker,
    WorkerStatus,
)
from .packed_attributes import check_packed_batch, fill_packed
from .pages import Page
from .queries import AttemptQuery, FilterLogic, ResourcesQuery, RolloutQuery, SortOrder, SpanQuery, WorkerQuery

T = TypeVar("T")


class _Unset:
    """Marks an argument that was not given, where None is a meaningful value."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Any = _Unset()


class LightningStore:
    """Rollouts and their queue, attempts, spans, resources and workers.

    Use as an async context manager (which opens it), or call `open()` first and `close()`
    when done. Methods raise `StoreClosedError` after `close()`.
    """

    name: str = "LightningStore"

    async def open(self) -> LightningStore:
        """Make the store ready (connect, migrate, start background work). Idempotent; a closed
        store cannot be reopened. The default has nothing to prepare."""
        return self

    async def __aenter__(self) -> LightningStore:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        raise NotImplementedError

    async def statistics(self) -> StoreStatistics:
        """Counts of rollouts (total and by status), attempts, spans, resources, workers."""
        raise NotImplementedError

    # --- rollouts and the queue ---------------------------------------------------------

    async def start_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        worker_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> AttemptedRollout:
        """Create a rollout in `preparing` with its first attempt, bypassing the queue.

        `resources_id=None` means the latest resources at this moment (None when there are none).
        A key of a rollout created by an enqueue and never started is a ConflictError.
        """
        raise NotImplementedError

    async def enqueue_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Rollout:
        """Append a rollout in `queuing` to the tail of the queue; no attempt yet.

        `resources_id=None` means the latest resources at this moment (None when there are none).
        """
        raise NotImplementedError

    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> Sequence[Rollout]:
        """Enqueue several rollouts in one transaction, in order."""
        raise NotImplementedError

    async def dequeue_rollout(
        self, worker_id: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> AttemptedRollout | None:
        """Claim the oldest queued rollout (FIFO over `queuing` and `requeuing`), or None.

        Never blocks. Creates attempt number (previous attempts + 1) in `preparing`. With
        `metadata`, only a rollout whose metadata holds each of these keys with that string
        value is claimed (a run claims its own rollouts in a store that several runs share).
        """
        raise NotImplementedError

    async def dequeue_many_rollouts(
        self, *, limit: int = 1, worker_id: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> Sequence[AttemptedRollout]:
        """Claim up to `limit` queued rollouts atomically, oldest first (`metadata` as `dequeue_rollout`)."""
        raise NotImplementedError

    async def start_attempt(self, rollout_id: str, worker_id: str | None = None) -> AttemptedRollout:
        """Create a new attempt of a rollout, finished or not (a manual retry); the rollout is
        `preparing` and follows this attempt from now on."""
        raise NotImplementedError

    async def update_rollout(
        self,
        rollout_id: str,
        input: TaskInput = UNSET,
        mode: RolloutMode | None = UNSET,
        resources_id: str | None = UNSET,
        status: RolloutStatus = UNSET,
        config: RolloutConfig = UNSET,
        metadata: dict[str, Any] | None = UNSET,
    ) -> Rollout:
        """Change the given fields; any status may be set. A terminal status sets `end_time`
        and wakes waiters; `queuing` / `requeuing` puts the rollout back in the queue exactly
        once; any other status clears `end_time`."""
        raise NotImplementedError

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"],
        status: AttemptStatus = UNSET,
        worker_id: str = UNSET,
        last_heartbeat_time: float = UNSET,
        metadata: dict[str, Any] = UNSET,
    ) -> Attempt:
        """Change an attempt; a status change of the latest attempt propagates to the rollout.

        None is not a value of any field (InvalidInputError): leave a field out to keep it.
        """
        raise NotImplementedError

    async def get_rollout_by_id(self, rollout_id: str) -> Rollout | None:
        """The rollout (an `AttemptedRollout` once it has attempts), or None."""
        raise NotImplementedError

    async def get_latest_attempt(self, rollout_id: str) -> Attempt | None:
        """The attempt with the highest `sequence_id`; None if none yet. Unknown rollout: NotFoundError."""
        raise NotImplementedError

    async def query_rollouts(
        self,
        *,
        status_in: Sequence[RolloutStatus] | None = None,
        rollout_id_in: Sequence[str] | None = None,
        rollout_id_contains: str | None = None,
        mode: RolloutMode | None = None,
        start_time_after: float | None = None,
        start_time_before: float | None = None,
        filter_logic: FilterLogic = "and",
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Page[Rollout]:
        """Rollouts matching the filters (combined by `filter_logic`), sorted and paged.

        `limit=-1` means no limit. The page's `total` is the number of matches before paging.
        """
        return await self.find_rollouts(RolloutQuery.of_call(locals()))

    async def find_rollouts(self, query: RolloutQuery) -> Page[Rollout]:
        """`query_rollouts`, its arguments as one model."""
        raise NotImplementedError

    async def query_attempts(
        self,
        rollout_id: str,
        *,
        sort_by: str | None = "sequence_id",
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Page[Attempt]:
        return await self.find_attempts(rollout_id, AttemptQuery.of_call(locals()))

    async def find_attempts(self, rollout_id: str, query: AttemptQuery) -> Page[Attempt]:
        """`query_attempts`, its sorting and paging as one model."""
        raise NotImplementedError

    async def wait_for_rollouts(self, *, rollout_ids: list[str], timeout: float | None = None) -> list[Rollout]:
        """Wait until every listed rollout is finished or `timeout` seconds pass.

        Returns the finished ones (all of them unless the timeout expired). `timeout=None`
        waits indefinitely. Ids the store does not know are not waited for and not returned.
        """
        raise NotImplementedError

    # --- spans --------------------------------------------------------------------------

    async def add_span(self, span: Span) -> Span | None:
        """Store one span; returns it with its sequence id, or None for a duplicate.

        A duplicate is a span with the same (rollout_id, attempt_id, span_id) as a stored
        one. The span is a heartbeat of its attempt and moves a `preparing` attempt and
        rollout to `running`. `sequence_id` None gets the next number; a given one (>= 0)
        is kept and pushes the counter past it. An `attempt_id` of "latest" is stored (and
        returned) as the rollout's latest attempt.
        """
        raise NotImplementedError

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        """Store spans in one transaction; returns those stored (duplicates left out)."""
        raise NotImplementedError

    async def add_packed_spans(self, spans: Sequence[Span], packed: Sequence[bytes | None]) -> Sequence[Span]:
        """`add_many_spans` for spans whose token arrays the client packed already.

        `packed[i]` is span i's blob (`packed_attributes.pack_attributes`) or None; the span's
        attributes hold `null` where the blob's arrays go. Each blob is checked against its
        span before anything is stored (InvalidInputError names the bad one). The default
        unpacks the blobs into the spans and calls `add_many_spans`.
        """
        check_packed_batch([span.attributes for span in spans], packed)
        for span, blob in zip(spans, packed, strict=False):
            if blob is not None:
                fill_packed(span.attributes, blob)
        return await self.add_many_spans(spans) if spans else []

    async def add_otel_span(
        self,
        rollout_id: str,
        attempt_id: str,
        readable_span: Any,
        sequence_id: int | None = None,
    ) -> Span | None:
        """Store an `opentelemetry.sdk.trace.ReadableSpan` as a span of the attempt."""
        raise NotImplementedError

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        """Issue the next sequence number of the rollout: 1, 2, ... strictly increasing,
        atomic across processes and clients. The rollout must exist; the attempt is not
        checked (numbers are per rollout)."""
        raise NotImplementedError

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[tuple[str, str]]) -> Sequence[int]:
        raise NotImplementedError

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        trace_id: str | None = None,
        trace_id_contains: str | None = None,
        span_id: str | None = None,
        span_id_contains: str | None = None,
        parent_id: str | None = None,
        parent_id_contains: str | None = None,
        name: str | None = None,
        name_contains: str | None = None,
        filter_logic: FilterLogic = "and",
        limit: int = -1,
        offset: int = 0,
        sort_by: str | None = "sequence_id",
        sort_order: SortOrder = "asc",
        compact: bool = False,
        attributes: Sequence[str] | None = None,
    ) -> Page[Span]:
        """Spans of a rollout (all attempts, one attempt, or the latest), in sequence order.

        With `compact`, an LLM call the store keeps as a delta of an earlier call of its
        attempt comes as that delta with an `agl.delta` attribute naming the earlier call
        (docs/spans.md): for readers that have the earlier call too, such as the trainer
        reading a whole attempt. A store that keeps every span whole returns whole spans,
        without `agl.delta`, which is what this default does.

        With `attributes`, each span keeps only those attribute keys (a compact read's
        `agl.delta` too): a reader that needs a few, such as the trainer, is not sent the
        request and response bodies. A store may return more than asked.
        """
        return await self.find_spans(SpanQuery.of_call(locals()))

    async def find_spans(self, query: SpanQuery) -> Page[Span]:
        """`query_spans`, its arguments as one model."""
        raise NotImplementedError

    async def find_span_rows(self, query: SpanQuery, decode: Callable[[Sequence[Any]], T]) -> Page[T]:
        """`find_spans` with each span as a stored row (SQLite's `SPAN_COLUMNS`) through `decode`
        instead of a Span: the HTTP server writes rows straight to JSON (`span_wire`).

        The default makes the rows from `find_spans`; a store that keeps rows hands them over.
        """
        from .sqlite.schema import span_to_row  # the row layout is SQLite's; sqlite imports this module

        page = await self.find_spans(query)
        return Page([decode(span_to_row(span, span.sequence_id)) for span in page], page.total)

    # --- resources ----------------------------------------------------------------------

    async def add_resources(self, resources: NamedResources) -> ResourcesUpdate:
        """Store a new resource set (version 1); it becomes the latest."""
        raise NotImplementedError

    async def update_resources(self, resources_id: str, resources: NamedResources) -> ResourcesUpdate:
        """Replace a resource set under a given id (created if new; version + 1 otherwise);
        it becomes the latest."""
        raise NotImplementedError

    async def get_resources_by_id(self, resources_id: str) -> ResourcesUpdate | None:
        raise NotImplementedError

    async def get_latest_resources(self) -> ResourcesUpdate | None:
        raise NotImplementedError

    async def query_resources(
        self,
        *,
        resources_id: str | None = None,
        resources_id_contains: str | None = None,
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Page[ResourcesUpdate]:
        return await self.find_resources(ResourcesQuery.of_call(locals()))

    async def find_resources(self, query: ResourcesQuery) -> Page[ResourcesUpdate]:
        """`query_resources`, its arguments as one model."""
        raise NotImplementedError

    # --- workers ------------------------------------------------------------------------

    async def update_worker(self, worker_id: str, heartbeat_stats: dict[str, Any] = UNSET) -> Worker:
        """Record a worker heartbeat (creates the worker on first sight)."""
        raise NotImplementedError

    async def query_workers(
        self,
        *,
        status_in: Sequence[WorkerStatus] | None = None,
        worker_id_contains: str | None = None,
        filter_logic: FilterLogic = "and",
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Page[Worker]:
        return await self.find_workers(WorkerQuery.of_call(locals()))

    async def find_workers(self, query: WorkerQuery) -> Page[Worker]:
        """`query_workers`, its arguments as one model."""
        raise NotImplementedError

    async def get_worker_by_id(self, worker_id: str) -> Worker | None:
        raise NotImplementedError

    # --- retention (beyond the agent-lightning contract) --------------------------------

    async def delete_rollouts(self, rollout_ids: Sequence[str]) -> int:
        """Delete finished rollouts with their attempts and spans; returns how many.

        A rollout that is not finished raises ConflictError and nothing is deleted.
        """
        raise NotImplementedError

    async def expire_rollouts(self, older_than_seconds: float) -> int:
        """Delete every finished rollout whose `end_time` is older than this; returns how many."""
        raise NotImplementedError
