"""The embedded SQLite backend of the LightningStore: `SQLiteStore`, on a file or in memory."""

from ..otel import span_from_otel
from ..pages import Page
from .spans import UNATTRIBUTED_ROLLOUT_ID
from .store import SQLiteStore

__all__ = ["Page", "SQLiteStore", "UNATTRIBUTED_ROLLOUT_ID", "span_from_otel"]
