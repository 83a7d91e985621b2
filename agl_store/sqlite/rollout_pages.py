"""`query_rollouts` on SQLite: a page whose cost does not grow with the store.

A page filtered by status is read one status at a time, each in index order
(`rollouts_status*`), merged by SQLite (`MERGE (UNION ALL)`) and cut at the page: neither the
matches nor the rows skipped by the offset are sorted or decoded. Its total comes from the
row counts the triggers keep (`row_counts`) when status is the only filter, so paging costs
the same at 1k rollouts as at 1M. Other filters still apply, row by row, within each status.

Queries this cannot serve in index order (filters joined by "or", `rollout_id_in`, sorts by
`rollout_id`, `mode` or `resources_id`) take the plain path: one WHERE, sorted by SQLite.
Either way the answer is the same: rows in the requested order, ties by insertion (rowid).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from ..models import ROLLOUT_STATUSES, Rollout
from ..pages import Page, page_total
from .paged import where_sql
from .schema import (
    ATTEMPT_COLUMNS,
    LATEST_ATTEMPT_JOIN,
    ROLLOUT_COLUMNS,
    ROLLOUT_COUNT_PREFIX,
    ROLLOUT_SELECT,
    rollout_from_row,
)

INDEX_ORDERED_SORTS = {"status": "r.status", "start_time": "r.start_time", "end_time": "r.end_time"}
"""Sorts that an index on (status, column) serves within one status; no sort means rowid order."""


class RolloutPageQuery:
    """A checked `query_rollouts`: its page statement, and how to find its total."""

    __slots__ = ("page_sql", "page_params", "count_sql", "count_params", "counted_statuses", "limit", "offset")

    def __init__(
        self,
        page_sql: str,
        page_params: list[Any],
        count_sql: str,
        count_params: list[Any],
        counted_statuses: Sequence[str] | None,
        limit: int,
        offset: int,
    ) -> None:
        self.page_sql, self.page_params = page_sql, page_params
        self.count_sql, self.count_params = count_sql, count_params
        self.counted_statuses = counted_statuses
        """When status is the only filter (or there is none): the total is these statuses' row counts."""
        self.limit, self.offset = limit, offset


def rollout_page_query(
    *,
    statuses: Sequence[str] | None,
    clauses: Sequence[str],
    params: Sequence[Any],
    logic: str,
    sort_by: str | None,
    descending: bool,
    limit: int,
    offset: int,
) -> RolloutPageQuery:
    """The statements of a page of rollouts. Everything is already checked.

    `statuses` is the status filter (None: none), `clauses` with `params` the other filters
    (on table alias `r`), joined with the status filter by `logic` ("and" or "or").
    `sort_by` is a rollout column or None (insertion order); `limit` -1 means no limit.
    """
    direction = "DESC" if descending else "ASC"
    statuses = None if statuses is None else list(dict.fromkeys(statuses))
    counted = None
    if not clauses:
        counted = list(ROLLOUT_STATUSES) if statuses is None else statuses
    if statuses and (logic == "and" or not clauses) and (sort_by is None or sort_by in INDEX_ORDERED_SORTS):
        return _index_ordered(statuses, clauses, params, sort_by, direction, counted, limit, offset)

    all_clauses, all_params = list(clauses), list(params)
    if statuses is not None:
        all_clauses.insert(0, "r.status IN (SELECT value FROM json_each(?))")
        all_params.insert(0, orjson.dumps(statuses))
    where = where_sql(all_clauses, logic)
    order = f" ORDER BY r.rowid {direction}"
    if sort_by is not None:
        order = f" ORDER BY r.{sort_by} {direction}, r.rowid {direction}"
    return RolloutPageQuery(
        ROLLOUT_SELECT + where + order + " LIMIT ? OFFSET ?",
        [*all_params, limit, offset],
        "SELECT count(*) FROM rollouts r" + where,
        all_params,
        counted,
        limit,
        offset,
    )


def _index_ordered(
    statuses: list[str],
    clauses: Sequence[str],
    params: Sequence[Any],
    sort_by: str | None,
    direction: str,
    counted: Sequence[str] | None,
    limit: int,
    offset: int,
) -> RolloutPageQuery:
    residual = "".join(f" AND ({clause})" for clause in clauses)
    sort = "" if sort_by is None else f"{INDEX_ORDERED_SORTS[sort_by]} AS s, "
    arm = f"SELECT {sort}r.rowid AS k FROM rollouts r WHERE r.status = ?{residual}"
    keys_order = f"k {direction}" if sort_by is None else f"s {direction}, k {direction}"
    page_order = f"page.k {direction}" if sort_by is None else f"page.s {direction}, page.k {direction}"
    keys = " UNION ALL ".join([arm] * len(statuses)) + f" ORDER BY {keys_order} LIMIT ? OFFSET ?"
    # The keys come out of the merge in order; only the page itself is sorted again.
    page_sql = (
        f"SELECT {ROLLOUT_COLUMNS}, {ATTEMPT_COLUMNS} FROM ({keys}) AS page "
        f"CROSS JOIN rollouts r ON r.rowid = page.k {LATEST_ATTEMPT_JOIN} ORDER BY {page_order}"
    )
    page_params: list[Any] = [value for status in statuses for value in (status, *params)]
    return RolloutPageQuery(
        page_sql,
        [*page_params, limit, offset],
        f"SELECT count(*) FROM rollouts r WHERE r.status IN (SELECT value FROM json_each(?)){residual}",
        [orjson.dumps(statuses), *params],
        counted,
        limit,
        offset,
    )


def rollout_counts(conn: sqlite3.Connection, statuses: Sequence[str]) -> int:
    """How many rollouts have one of these statuses, from the counts the triggers keep."""
    row = conn.execute(
        "SELECT coalesce(sum(value), 0) FROM row_counts WHERE name IN (SELECT ? || value FROM json_each(?))",
        (ROLLOUT_COUNT_PREFIX, orjson.dumps(list(statuses))),
    ).fetchone()
    return int(row[0])


def read_rollout_page(conn: sqlite3.Connection, query: RolloutPageQuery) -> Page[Rollout]:
    """Run in one read snapshot, so the total and the page agree."""
    rows = conn.execute(query.page_sql, query.page_params).fetchall()
    total = page_total(len(rows), query.limit, query.offset)
    if total is None:
        if query.counted_statuses is not None:
            total = rollout_counts(conn, query.counted_statuses)
        else:
            total = conn.execute(query.count_sql, query.count_params).fetchone()[0]
    return Page([rollout_from_row(row) for row in rows], total)
