"""Pages of `query_rollouts` on SQLite: read in index order, with the same answers as a plain sort."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agl_store.models import Rollout
from agl_store.sqlite import SQLiteStore
from agl_store.sqlite.rollout_pages import rollout_page_query
from agl_store.sqlite.schema import apply_migrations


def page_plan(**query: Any) -> list[str]:
    """EXPLAIN QUERY PLAN lines of the keys subquery (`CO-ROUTINE page` and what is under it)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        apply_migrations(conn)
        built = rollout_page_query(clauses=[], params=[], logic="and", limit=50, offset=400, **query)
        rows = conn.execute("EXPLAIN QUERY PLAN " + built.page_sql, built.page_params).fetchall()
    finally:
        conn.close()
    (page,) = [node for node, _, _, detail in rows if detail.startswith("CO-ROUTINE page")]
    under, lines = {page}, []
    for node, parent, _, detail in rows:
        if parent in under:
            under.add(node)
            lines.append(detail)
    return lines


@pytest.mark.parametrize("sort_by", [None, "start_time", "end_time", "status"])
def test_a_page_filtered_by_status_is_read_in_index_order(sort_by: str | None) -> None:
    lines = page_plan(statuses=["succeeded", "failed"], sort_by=sort_by, descending=True)

    assert "MERGE (UNION ALL)" in lines  # one status at a time, merged
    reads = [line for line in lines if " r " in f" {line} "]
    assert len(reads) == 2 and all(line.startswith("SEARCH r USING COVERING INDEX rollouts_status") for line in reads)
    assert not any("TEMP B-TREE" in line for line in lines)  # nothing sorted but the page itself


MODES = ["train", "val", None]
STATUS_CYCLE = ["succeeded", "failed", "succeeded", "running", "queuing", "cancelled", "succeeded"]


@pytest.fixture
async def varied_store(tmp_path: Path) -> Any:
    """45 rollouts of every status and mode, some with equal sort keys (status, null end times)."""
    async with SQLiteStore(tmp_path / "pages.db") as store:
        for index in range(45):
            status = STATUS_CYCLE[index % len(STATUS_CYCLE)]
            mode = MODES[index % len(MODES)]
            if status == "queuing":
                await store.enqueue_rollout(input=index, mode=mode)
                continue
            started = await store.start_rollout(input=index, mode=mode)
            if status == "running":
                continue
            if status == "cancelled":
                await store.update_rollout(started.rollout_id, status="cancelled")
            else:
                await store.update_attempt(started.rollout_id, "latest", status=status)
        yield store


def expected_page(
    everything: Sequence[Rollout],
    statuses: Sequence[str] | None,
    mode: str | None,
    logic: str,
    sort_by: str | None,
    descending: bool,
    limit: int,
    offset: int,
) -> tuple[list[str], int]:
    """What a plain filter and sort gives: rowid (insertion) order breaks ties, nulls sort first."""
    tests = []
    if statuses is not None:
        tests.append(lambda r: r.status in statuses)
    if mode is not None:
        tests.append(lambda r: r.mode == mode)
    combine = all if logic == "and" else any
    matches = [(rowid, r) for rowid, r in enumerate(everything) if not tests or combine(t(r) for t in tests)]
    if sort_by is not None:
        matches.sort(key=lambda m: (getattr(m[1], sort_by) is not None, getattr(m[1], sort_by) or 0, m[0]))
    if descending:
        matches.reverse()
    ids = [r.rollout_id for _, r in matches]
    return ids[offset:] if limit < 0 else ids[offset : offset + limit], len(ids)


STATUS_FILTERS = [None, [], ["succeeded"], ["failed", "succeeded"], ["succeeded", "succeeded", "queuing"], ["running"]]


async def test_pages_give_the_same_answers_as_a_plain_sort(varied_store: SQLiteStore) -> None:
    everything = await varied_store.query_rollouts()
    assert len(everything) == 45
    combinations = itertools.product(
        STATUS_FILTERS,
        [None, "train"],
        ["and", "or"],
        [None, "start_time", "end_time", "status", "mode"],
        [False, True],
        [(7, 0), (7, 14), (-1, 3), (10, 44), (5, 100), (0, 0)],
    )
    for statuses, mode, logic, sort_by, descending, (limit, offset) in combinations:
        page = await varied_store.query_rollouts(
            status_in=statuses,
            mode=mode,
            filter_logic=logic,
            sort_by=sort_by,
            sort_order="desc" if descending else "asc",
            limit=limit,
            offset=offset,
        )
        ids, total = expected_page(everything, statuses, mode, logic, sort_by, descending, limit, offset)
        case = (statuses, mode, logic, sort_by, descending, limit, offset)
        assert [r.rollout_id for r in page] == ids, case
        assert page.total == total, case
