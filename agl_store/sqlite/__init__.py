"""The embedded SQLite backend of the LightningStore: `SQLiteStore`, on a file or in memory."""

from .spans import UNATTRIBUTED_ROLLOUT_ID
from .store import SQLiteStore

__all__ = ["SQLiteStore", "UNATTRIBUTED_ROLLOUT_ID"]
