"""agl_store: the LightningStore — rollouts, attempts, spans, resources, workers."""

from .base import UNSET, LightningStore
from .client import LightningStoreClient
from .errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    UnauthorizedError,
)
from .models import (
    LLM,
    Attempt,
    AttemptedRollout,
    EnqueueRolloutRequest,
    PromptTemplate,
    ProxyLLM,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    Span,
    StoreStatistics,
    Worker,
    reward_span,
)
from .opening import open_store
from .pages import Page
from .sqlite import SQLiteStore

__all__ = [
    "UNSET",
    "LLM",
    "Attempt",
    "AttemptedRollout",
    "ConflictError",
    "EnqueueRolloutRequest",
    "InvalidInputError",
    "LightningStore",
    "LightningStoreClient",
    "NotFoundError",
    "Page",
    "PromptTemplate",
    "ProxyLLM",
    "ResourcesUpdate",
    "Rollout",
    "RolloutConfig",
    "Span",
    "SQLiteStore",
    "StoreClosedError",
    "StoreError",
    "StoreStatistics",
    "StoreUnavailableError",
    "UnauthorizedError",
    "Worker",
    "open_store",
    "reward_span",
]
