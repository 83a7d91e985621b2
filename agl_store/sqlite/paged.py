"""A checked, paged SELECT, run in one snapshot: its rows, and the count of matches before paging."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from ..pages import Page, page_total

T = TypeVar("T")


def joined(clauses: list[str], logic: str) -> str:
    """`(a) AND (b) ...` (or OR, by `logic`); empty for no clauses."""
    return f" {logic.upper()} ".join(f"({clause})" for clause in clauses)


def where_sql(clauses: list[str], logic: str) -> str:
    """` WHERE (a) AND (b) ...`; empty for no clauses."""
    return " WHERE " + joined(clauses, logic) if clauses else ""


class PagedQuery:
    """A checked, paged SELECT: its rows, and the count of matches before paging."""

    __slots__ = ("select", "count", "where", "params", "order", "limit", "offset")

    def __init__(
        self, *, select: str, count: str, where: str, params: list[Any], order: str, limit: int, offset: int
    ) -> None:
        self.select, self.count, self.where, self.params = select, count, where, params
        self.order, self.limit, self.offset = order, limit, offset


def run_paged(
    conn: sqlite3.Connection,
    query: PagedQuery,
    decode: Callable[[Any], T],
    complete: Callable[[sqlite3.Connection, list[Any]], list[Any]] | None = None,
) -> Page[T]:
    """The page's rows through `complete` (in the same snapshot: reads of other rows they
    need), then each through `decode`."""
    rows = conn.execute(
        query.select + query.where + query.order + " LIMIT ? OFFSET ?", (*query.params, query.limit, query.offset)
    ).fetchall()
    if complete is not None:
        rows = complete(conn, rows)
    total = page_total(len(rows), query.limit, query.offset)
    if total is None:
        total = conn.execute(query.count + query.where, query.params).fetchone()[0]
    return Page([decode(row) for row in rows], total)
