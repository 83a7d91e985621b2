"""The rollout queue (enqueue, dequeue) and the long poll that waits for rollouts to finish."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from ...bounds import check_integer
from ...web.wire import endpoint, store_of, validate_model
from ..schemas import DequeueManyBody, EnqueueManyBody, WaitBody

WAIT_CAP_SECONDS = 300.0
"""Longest a single wait request is held open; clients poll again for longer waits."""


async def enqueue_rollouts(request: Request) -> Any:
    body = validate_model(EnqueueManyBody, await request.body())
    store = store_of(request)
    if not body.rollouts:
        return []
    if len(body.rollouts) == 1:
        one = body.rollouts[0]
        return [
            await store.enqueue_rollout(
                input=one.input,
                mode=one.mode,
                resources_id=one.resources_id,
                config=one.config,
                metadata=one.metadata,
                idempotency_key=one.idempotency_key,
            )
        ]
    return list(await store.enqueue_many_rollouts(body.rollouts))


async def dequeue_rollouts(request: Request) -> Any:
    body = validate_model(DequeueManyBody, await request.body(), allow_empty=True)
    store = store_of(request)
    if check_integer(body.limit, "limit") <= 0:
        return []
    if body.limit == 1:
        one = await store.dequeue_rollout(worker_id=body.worker_id, metadata=body.metadata)
        return [one] if one is not None else []
    return list(await store.dequeue_many_rollouts(limit=body.limit, worker_id=body.worker_id, metadata=body.metadata))


async def wait_for_rollouts(request: Request) -> Any:
    body = validate_model(WaitBody, await request.body())
    timeout = WAIT_CAP_SECONDS if body.timeout is None else min(body.timeout, WAIT_CAP_SECONDS)
    return await store_of(request).wait_for_rollouts(rollout_ids=body.rollout_ids, timeout=timeout)


def routes(prefix: str) -> list[Route]:
    return [
        endpoint(prefix + "/queues/rollouts/enqueue", enqueue_rollouts, methods=["POST"], status_code=201),
        endpoint(prefix + "/queues/rollouts/dequeue", dequeue_rollouts, methods=["POST"]),
        endpoint(prefix + "/waits/rollouts", wait_for_rollouts, methods=["POST"]),
    ]
