"""Resource sets: add, replace under an id, read by id or the latest, query."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.routing import Route

from ...models import NamedResources, ResourcesUpdate
from ...queries import ResourcesQuery
from ...web.wire import endpoint, store_of, validate_json, validate_query
from ..schemas import check_page, page_of

NAMED_RESOURCES: TypeAdapter[NamedResources] = TypeAdapter(NamedResources)


async def add_resources(request: Request) -> Any:
    return await store_of(request).add_resources(validate_json(NAMED_RESOURCES, await request.body()))


async def update_resources(request: Request) -> Any:
    resources = validate_json(NAMED_RESOURCES, await request.body())
    return await store_of(request).update_resources(request.path_params["resources_id"], resources)


async def get_resources(request: Request) -> Any:
    return await store_of(request).get_resources_by_id(request.path_params["resources_id"])


async def latest_resources(request: Request) -> Any:
    return await store_of(request).get_latest_resources()


async def _query(request: Request, query: ResourcesQuery) -> Any:
    check_page(query, ResourcesUpdate)
    return page_of(await store_of(request).find_resources(query), query)


async def query_resources(request: Request) -> Any:
    return await _query(request, validate_query(ResourcesQuery, request))


def routes(prefix: str) -> list[Route]:
    base = prefix + "/resources"
    return [
        endpoint(base, add_resources, methods=["POST"], status_code=201),
        endpoint(base, query_resources, methods=["GET"]),
        endpoint(base + "/latest", latest_resources, methods=["GET"]),
        endpoint(base + "/{resources_id}", get_resources, methods=["GET"]),
        endpoint(base + "/{resources_id}", update_resources, methods=["POST"]),
    ]
