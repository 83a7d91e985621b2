"""Request bodies of the store routes; queries' bodies and query strings are `agl_store.queries`.

Names, fields and defaults match the agent-lightning 0.3 store server, so the bodies its
client sends validate here unchanged; the models after `# --- agl additions` are ours.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ..base import UNSET
from ..bounds import check_integer
from ..errors import InvalidInputError, invalid_sort_by
from ..models import AttemptStatus, EnqueueRolloutRequest, RolloutConfig, RolloutMode, RolloutStatus, TaskInput
from ..pages import Page
from ..queries import Paging


class StartRolloutBody(BaseModel):
    input: TaskInput
    mode: RolloutMode | None = None
    resources_id: str | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None
    worker_id: str | None = None
    idempotency_key: str | None = None  # agl's addition


class WorkerIdBody(BaseModel):
    worker_id: str | None = None


class EnqueueManyBody(BaseModel):
    rollouts: list[EnqueueRolloutRequest]


class DequeueManyBody(BaseModel):
    limit: int = 1
    worker_id: str | None = None
    metadata: Any = None  # the store checks it (strings to strings) and names what is wrong


class WaitBody(BaseModel):
    rollout_ids: list[str]
    timeout: float | None = Field(default=None, ge=0)


class NextSequenceIdBody(BaseModel):
    rollout_id: str
    attempt_id: str


class UpdateRolloutBody(BaseModel):
    input: TaskInput | None = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    status: RolloutStatus | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None


class UpdateAttemptBody(BaseModel):
    status: AttemptStatus | None = None
    worker_id: str | None = None
    last_heartbeat_time: float | None = None
    metadata: dict[str, Any] | None = None


class UpdateWorkerBody(BaseModel):
    heartbeat_stats: dict[str, Any] | None = None


# --- agl additions ---------------------------------------------------------------------


class ManySequenceIdsBody(BaseModel):
    rollout_attempt_ids: list[tuple[str, str]]


class DeleteRolloutsBody(BaseModel):
    rollout_ids: list[str]


class ExpireRolloutsBody(BaseModel):
    older_than_seconds: float = Field(ge=0)


def check_page(query: Paging, item_model: type[BaseModel]) -> None:
    """Reject paging that agent-lightning 0.3 rejects, naming the field."""
    if query.sort_by is not None and query.sort_by not in item_model.model_fields:
        raise invalid_sort_by(query.sort_by, item_model.model_fields)
    if query.limit == 0 or query.limit < -1:
        raise InvalidInputError(f"limit must be greater than 0, or -1 for no limit; got {query.limit}")
    if query.offset < 0:
        raise InvalidInputError(f"offset must be greater than or equal to 0; got {query.offset}")
    check_integer(query.limit, "limit")
    check_integer(query.offset, "offset")


def page_of(page: Page[Any], query: Paging) -> dict[str, Any]:
    """The PaginatedResult wire shape: items, limit, offset, total (matches before paging)."""
    return {"items": list(page), "limit": query.limit, "offset": query.offset, "total": page.total}


def set_or_unset(body: BaseModel, field: str, *, nullable: bool = True) -> Any:
    """The field's value when the body names it, else UNSET (the store leaves it as is); null only where allowed."""
    if field not in body.model_fields_set:
        return UNSET
    value = getattr(body, field)
    if value is None and not nullable:
        raise InvalidInputError(f"{field} is invalid; it cannot be a null value.")
    return value
