"""`Page`: what every store's query methods return, and when a page shows its own total."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


class Page(list[T]):
    """One page of a query: a plain list plus `total`, the match count before paging.

    Every `query_*` and `find_*` method of a LightningStore returns one, whatever the backend.
    """

    total: int

    def __init__(self, items: Sequence[T] = (), total: int | None = None) -> None:
        super().__init__(items)
        self.total = len(self) if total is None else total

    def __repr__(self) -> str:
        return f"Page({list.__repr__(self)}, total={self.total})"


def page_total(rows: int, limit: int, offset: int) -> int | None:
    """The match count when a page of `rows` rows shows it (it is the last page), else None.

    `limit` -1 means no limit. An empty page past offset 0 shows nothing: the matches may
    end anywhere before it.
    """
    if rows == 0 and offset > 0:
        return None
    if limit < 0 or rows < limit:
        return offset + rows
    return None
