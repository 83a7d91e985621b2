"""Rollouts: start (bypassing the queue), query, read, update, delete and expire."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from ...models import Rollout
from ...queries import RolloutQuery
from ...web.wire import endpoint, store_of, validate_model, validate_query
from ..schemas import (
    DeleteRolloutsBody,
    ExpireRolloutsBody,
    StartRolloutBody,
    UpdateRolloutBody,
    check_page,
    page_of,
    set_or_unset,
)


async def start_rollout(request: Request) -> Any:
    body = validate_model(StartRolloutBody, await request.body())
    return await store_of(request).start_rollout(
        input=body.input,
        mode=body.mode,
        resources_id=body.resources_id,
        config=body.config,
        metadata=body.metadata,
        worker_id=body.worker_id,
        idempotency_key=body.idempotency_key,
    )


async def _query(request: Request, query: RolloutQuery) -> Any:
    check_page(query, Rollout)
    return page_of(await store_of(request).find_rollouts(query), query)


async def query_rollouts(request: Request) -> Any:
    query = validate_query(RolloutQuery, request, list_fields=RolloutQuery.list_fields)
    return await _query(request, query)


async def search_rollouts(request: Request) -> Any:
    return await _query(request, validate_model(RolloutQuery, await request.body(), allow_empty=True))


async def get_rollout(request: Request) -> Any:
    return await store_of(request).get_rollout_by_id(request.path_params["rollout_id"])


async def update_rollout(request: Request) -> Any:
    body = validate_model(UpdateRolloutBody, await request.body())
    return await store_of(request).update_rollout(
        request.path_params["rollout_id"],
        input=set_or_unset(body, "input"),
        mode=set_or_unset(body, "mode"),
        resources_id=set_or_unset(body, "resources_id"),
        status=set_or_unset(body, "status", nullable=False),
        config=set_or_unset(body, "config", nullable=False),
        metadata=set_or_unset(body, "metadata"),
    )


async def delete_rollout(request: Request) -> Any:
    deleted = await store_of(request).delete_rollouts([request.path_params["rollout_id"]])
    return {"deleted": deleted}


async def delete_rollouts(request: Request) -> Any:
    body = validate_model(DeleteRolloutsBody, await request.body())
    return {"deleted": await store_of(request).delete_rollouts(body.rollout_ids)}


async def expire_rollouts(request: Request) -> Any:
    body = validate_model(ExpireRolloutsBody, await request.body())
    return {"deleted": await store_of(request).expire_rollouts(body.older_than_seconds)}


def routes(prefix: str) -> list[Route]:
    base = prefix + "/rollouts"
    return [
        endpoint(base, start_rollout, methods=["POST"], status_code=201),
        endpoint(base, query_rollouts, methods=["GET"]),
        endpoint(base + "/search", search_rollouts, methods=["POST"]),
        endpoint(base + "/delete", delete_rollouts, methods=["POST"]),
        endpoint(base + "/expire", expire_rollouts, methods=["POST"]),
        endpoint(base + "/{rollout_id}", get_rollout, methods=["GET"]),
        endpoint(base + "/{rollout_id}", update_rollout, methods=["POST"]),
        endpoint(base + "/{rollout_id}", delete_rollout, methods=["DELETE"]),
    ]
