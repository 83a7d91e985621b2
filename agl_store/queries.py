"""The query model: each `query_*` method's filters, sort fields and paging, written once.

`LightningStore.query_*` take these fields as keyword arguments (agent-lightning 0.3's
signatures) and pass one of these models to the backend's `find_*`; the HTTP client sends a
model's fields as the request, and the store server validates requests against the same
models. Field names and defaults match the agent-lightning 0.3 store server, so the bodies its
client sends validate here unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel

from .models import RolloutMode, RolloutStatus, WorkerStatus

SortOrder = Literal["asc", "desc"]
FilterLogic = Literal["and", "or"]

Q = TypeVar("Q", bound="Paging")


class Paging(BaseModel):
    """Sorting and paging, common to every query. `limit` -1 means no limit."""

    sort_fields: ClassVar[frozenset[str]] = frozenset()
    """The fields a store sorts this query's items by (besides its default order)."""
    list_fields: ClassVar[tuple[str, ...]] = ()
    """Filters given as lists: left out of a request when None ("no filter"), as an empty list
    means "match nothing"."""

    limit: int = -1
    offset: int = 0
    sort_by: str | None = None
    sort_order: SortOrder = "asc"

    @classmethod
    def of_call(cls: type[Q], arguments: Mapping[str, Any]) -> Q:
        """The query of a `query_*` call, from its `locals()`, values as given: each backend checks
        them its own way (the SQLite store in Python, the HTTP client on the server)."""
        return cls.model_construct(**{name: arguments[name] for name in cls.model_fields if name in arguments})

    def request_fields(self) -> dict[str, Any]:
        """The fields as a request sends them: list filters as lists, and left out when None."""
        fields: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name in self.list_fields:
                if value is None:
                    continue
                value = list(value)
            fields[name] = value
        return fields


class RolloutQuery(Paging):
    sort_fields: ClassVar[frozenset[str]] = frozenset(
        {"rollout_id", "start_time", "end_time", "status", "mode", "resources_id"}
    )
    list_fields: ClassVar[tuple[str, ...]] = ("status_in", "rollout_id_in")

    status_in: list[RolloutStatus] | None = None
    rollout_id_in: list[str] | None = None
    rollout_id_contains: str | None = None
    mode: RolloutMode | None = None
    start_time_after: float | None = None
    start_time_before: float | None = None
    filter_logic: FilterLogic = "and"


class AttemptQuery(Paging):
    """The attempts of one rollout (named apart: the route's path, the method's first argument)."""

    sort_fields: ClassVar[frozenset[str]] = frozenset(
        {"sequence_id", "attempt_id", "start_time", "end_time", "status", "worker_id", "last_heartbeat_time"}
    )

    sort_by: str | None = "sequence_id"


class SpanQuery(Paging):
    """Spans of a rollout: all attempts, one attempt, or `"latest"`."""

    sort_fields: ClassVar[frozenset[str]] = frozenset(
        {"sequence_id", "start_time", "end_time", "name", "trace_id", "span_id", "parent_id", "attempt_id"}
    )

    rollout_id: str
    attempt_id: str | None = None
    trace_id: str | None = None
    trace_id_contains: str | None = None
    span_id: str | None = None
    span_id_contains: str | None = None
    parent_id: str | None = None
    parent_id_contains: str | None = None
    name: str | None = None
    name_contains: str | None = None
    filter_logic: FilterLogic = "and"
    sort_by: str | None = "sequence_id"
    compact: bool = False
    """LLM calls stored as deltas come as their delta plus `agl.delta` (docs/spans.md)."""
    attributes: list[str] | None = None
    """Only these attribute keys of each span (and `agl.delta` of a compact read); None: all."""

    list_fields: ClassVar[tuple[str, ...]] = ("attributes",)


class ResourcesQuery(Paging):
    sort_fields: ClassVar[frozenset[str]] = frozenset({"resources_id", "create_time", "update_time", "version"})

    resources_id: str | None = None
    resources_id_contains: str | None = None


class WorkerQuery(Paging):
    sort_fields: ClassVar[frozenset[str]] = frozenset(
        {
            "worker_id",
            "status",
            "last_heartbeat_time",
            "last_dequeue_time",
            "last_busy_time",
            "last_idle_time",
            "current_rollout_id",
        }
    )
    list_fields: ClassVar[tuple[str, ...]] = ("status_in",)

    status_in: list[WorkerStatus] | None = None
    worker_id_contains: str | None = None
    filter_logic: FilterLogic = "and"
