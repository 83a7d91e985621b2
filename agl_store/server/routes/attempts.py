"""Attempts of a rollout: start one (a manual retry), query, the latest, update."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from ...models import Attempt
from ...queries import AttemptQuery
from ...web.wire import endpoint, store_of, validate_model, validate_query
from ..schemas import UpdateAttemptBody, WorkerIdBody, check_page, page_of, set_or_unset


async def start_attempt(request: Request) -> Any:
    body = validate_model(WorkerIdBody, await request.body(), allow_empty=True)
    return await store_of(request).start_attempt(request.path_params["rollout_id"], worker_id=body.worker_id)


async def _query(request: Request, query: AttemptQuery) -> Any:
    check_page(query, Attempt)
    return page_of(await store_of(request).find_attempts(request.path_params["rollout_id"], query), query)


async def query_attempts(request: Request) -> Any:
    return await _query(request, validate_query(AttemptQuery, request))


async def search_attempts(request: Request) -> Any:
    return await _query(request, validate_model(AttemptQuery, await request.body(), allow_empty=True))


async def latest_attempt(request: Request) -> Any:
    return await store_of(request).get_latest_attempt(request.path_params["rollout_id"])


async def update_attempt(request: Request) -> Any:
    body = validate_model(UpdateAttemptBody, await request.body())
    return await store_of(request).update_attempt(
        request.path_params["rollout_id"],
        request.path_params["attempt_id"],
        status=set_or_unset(body, "status", nullable=False),
        worker_id=set_or_unset(body, "worker_id", nullable=False),
        last_heartbeat_time=set_or_unset(body, "last_heartbeat_time", nullable=False),
        metadata=set_or_unset(body, "metadata", nullable=False),
    )


def routes(prefix: str) -> list[Route]:
    base = prefix + "/rollouts/{rollout_id}/attempts"
    return [
        endpoint(base, start_attempt, methods=["POST"], status_code=201),
        endpoint(base, query_attempts, methods=["GET"]),
        endpoint(base + "/search", search_attempts, methods=["POST"]),
        endpoint(base + "/latest", latest_attempt, methods=["GET"]),
        endpoint(base + "/{attempt_id}", update_attempt, methods=["POST"]),
    ]
