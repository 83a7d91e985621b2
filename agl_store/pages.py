"""`Page`: what every store's query methods return."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


class Page(list[T]):
    """One page of a query: a plain list plus `total`, the match count before paging."""

    def __init__(self, items: Sequence[T] = (), total: int | None = None) -> None:
        super().__init__(items)
        self.total = len(self) if total is None else total
