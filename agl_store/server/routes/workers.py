"""Workers: heartbeat (creating the worker on first sight), read, query."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from ...models import Worker
from ...queries import WorkerQuery
from ...web.wire import endpoint, store_of, validate_model, validate_query
from ..schemas import UpdateWorkerBody, check_page, page_of, set_or_unset


async def _query(request: Request, query: WorkerQuery) -> Any:
    check_page(query, Worker)
    return page_of(await store_of(request).find_workers(query), query)


async def query_workers(request: Request) -> Any:
    return await _query(request, validate_query(WorkerQuery, request, list_fields=WorkerQuery.list_fields))


async def search_workers(request: Request) -> Any:
    return await _query(request, validate_model(WorkerQuery, await request.body(), allow_empty=True))


async def get_worker(request: Request) -> Any:
    return await store_of(request).get_worker_by_id(request.path_params["worker_id"])


async def update_worker(request: Request) -> Any:
    body = validate_model(UpdateWorkerBody, await request.body(), allow_empty=True)
    return await store_of(request).update_worker(
        request.path_params["worker_id"],
        heartbeat_stats=set_or_unset(body, "heartbeat_stats", nullable=False),
    )


def routes(prefix: str) -> list[Route]:
    base = prefix + "/workers"
    return [
        endpoint(base, query_workers, methods=["GET"]),
        endpoint(base + "/search", search_workers, methods=["POST"]),
        endpoint(base + "/{worker_id}", get_worker, methods=["GET"]),
        endpoint(base + "/{worker_id}", update_worker, methods=["POST"]),
    ]
