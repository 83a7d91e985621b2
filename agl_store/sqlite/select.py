"""Each query of `agl_store.queries` as SQL: checked filters joined by the query's filter logic,
and an ORDER BY whose default order breaks ties, so pages are stable."""

from __future__ import annotations

from typing import Any

import orjson

from ..models import LATEST_ATTEMPT
from ..queries import AttemptQuery, ResourcesQuery, RolloutQuery, SpanQuery, WorkerQuery
from ..transitions import check_rollout_mode, check_rollout_status, check_worker_status
from .checks import as_list, check_logic, check_number, check_paging, check_sort
from .paged import PagedQuery, joined, where_sql
from .rollout_pages import RolloutPageQuery, rollout_page_query
from .schema import ATTEMPT_COLUMNS, RESOURCES_COLUMNS, STORED_SPAN_COLUMNS, WORKER_COLUMNS


def order_by(table: str | None, sort_by: str | None, allowed: frozenset[str], sort_order: Any, *, default: str) -> str:
    check_sort(sort_by, allowed, sort_order)
    direction = sort_order.upper()
    if sort_by is None:
        return f" ORDER BY {default} {direction}"
    prefix = f"{table}." if table else ""
    # The default order breaks ties, so pages are stable.
    return f" ORDER BY {prefix}{sort_by} {direction}, {default} {direction}"


def paged(**parts: Any) -> PagedQuery:
    check_paging(parts["limit"], parts["offset"])
    return PagedQuery(**parts)


class Where:
    """Filter clauses and their parameters, joined by the query's filter_logic."""

    def __init__(self) -> None:
        self.clauses: list[str] = []
        self.params: list[Any] = []

    def add(self, clause: str, param: Any) -> None:
        self.clauses.append(clause)
        self.params.append(param)

    def sql(self, logic: str) -> str:
        return where_sql(self.clauses, logic)


def select_rollouts(query: RolloutQuery) -> RolloutPageQuery:
    statuses = None
    if query.status_in is not None:
        statuses = [check_rollout_status(s, "status_in") for s in as_list(query.status_in, "status_in")]
    where = Where()
    if query.rollout_id_in is not None:
        where.add(
            "r.rollout_id IN (SELECT value FROM json_each(?))",
            orjson.dumps(as_list(query.rollout_id_in, "rollout_id_in")),
        )
    if query.rollout_id_contains is not None:
        where.add("instr(r.rollout_id, ?) > 0", query.rollout_id_contains)
    if query.mode is not None:
        where.add("r.mode = ?", check_rollout_mode(query.mode))
    if query.start_time_after is not None:
        where.add("r.start_time > ?", check_number(query.start_time_after, "start_time_after"))
    if query.start_time_before is not None:
        where.add("r.start_time < ?", check_number(query.start_time_before, "start_time_before"))
    check_sort(query.sort_by, RolloutQuery.sort_fields, query.sort_order)
    check_paging(query.limit, query.offset)
    return rollout_page_query(
        statuses=statuses,
        clauses=where.clauses,
        params=where.params,
        logic=check_logic(query.filter_logic),
        sort_by=query.sort_by,
        descending=query.sort_order == "desc",
        limit=query.limit,
        offset=query.offset,
    )


def select_attempts(rollout_id: str, query: AttemptQuery) -> PagedQuery:
    return paged(
        select=f"SELECT {ATTEMPT_COLUMNS} FROM attempts a",
        count="SELECT count(*) FROM attempts a",
        where=" WHERE a.rollout_id = ?",
        params=[rollout_id],
        order=order_by("a", query.sort_by, AttemptQuery.sort_fields, query.sort_order, default="a.sequence_id"),
        limit=query.limit,
        offset=query.offset,
    )


def select_spans(query: SpanQuery) -> PagedQuery:
    where = Where()
    for column, exact, contains in (
        ("trace_id", query.trace_id, query.trace_id_contains),
        ("span_id", query.span_id, query.span_id_contains),
        ("parent_id", query.parent_id, query.parent_id_contains),
        ("name", query.name, query.name_contains),
    ):
        if exact is not None:
            where.add(f"{column} = ?", exact)
        if contains is not None:
            where.add(f"instr({column}, ?) > 0", contains)
    optional = joined(where.clauses, check_logic(query.filter_logic))
    attempt_id = query.attempt_id
    must, must_params = " WHERE rollout_id = ?", [query.rollout_id]
    if attempt_id == LATEST_ATTEMPT:  # none for a rollout without attempts, or an unknown one
        must += " AND attempt_id = (SELECT latest_attempt_id FROM rollouts WHERE rollout_id = ?)"
        must_params.append(query.rollout_id)
    elif attempt_id is not None:
        must += " AND attempt_id = ?"
        must_params.append(attempt_id)
    return paged(
        select=f"SELECT {STORED_SPAN_COLUMNS} FROM spans",
        count="SELECT count(*) FROM spans",
        where=must + (f" AND ({optional})" if optional else ""),
        params=[*must_params, *where.params],
        order=order_by(None, query.sort_by, SpanQuery.sort_fields, query.sort_order, default="pk"),
        limit=query.limit,
        offset=query.offset,
    )


def select_resources(query: ResourcesQuery) -> PagedQuery:
    where = Where()
    if query.resources_id is not None:
        where.add("resources_id = ?", query.resources_id)
    if query.resources_id_contains is not None:
        where.add("instr(resources_id, ?) > 0", query.resources_id_contains)
    return paged(
        select=f"SELECT {RESOURCES_COLUMNS} FROM resources",
        count="SELECT count(*) FROM resources",
        where=where.sql("and"),
        params=where.params,
        order=order_by(None, query.sort_by, ResourcesQuery.sort_fields, query.sort_order, default="rowid"),
        limit=query.limit,
        offset=query.offset,
    )


def select_workers(query: WorkerQuery) -> PagedQuery:
    where = Where()
    if query.status_in is not None:
        statuses = [check_worker_status(s, "status_in") for s in as_list(query.status_in, "status_in")]
        where.add("status IN (SELECT value FROM json_each(?))", orjson.dumps(statuses))
    if query.worker_id_contains is not None:
        where.add("instr(worker_id, ?) > 0", query.worker_id_contains)
    return paged(
        select=f"SELECT {WORKER_COLUMNS} FROM workers",
        count="SELECT count(*) FROM workers",
        where=where.sql(check_logic(query.filter_logic)),
        params=where.params,
        order=order_by(None, query.sort_by, WorkerQuery.sort_fields, query.sort_order, default="rowid"),
        limit=query.limit,
        offset=query.offset,
    )
