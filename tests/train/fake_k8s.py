"""A hand-written Kubernetes API for fault injection: Jobs, their pods' logs, deletions.

No cluster exists here, so this fake stands in for the API server at the level the runner
uses it (REST paths and JSON shapes of batch/v1 Jobs and core/v1 pod logs). A test decides
how each Job ends through `outcome`: "Complete" with a log, "Failed", or never ending.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route


@dataclass
class FakeKube:
    outcome: str | None = "Complete"  # "Complete", "Failed" or None (runs forever)
    log: str = ""
    polls_before_end: int = 1
    token: str = "sekret"
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    created: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    polls: dict[str, int] = field(default_factory=dict)

    def app(self) -> Starlette:
        def authorized(request: Request) -> bool:
            return request.headers.get("authorization") == f"Bearer {self.token}"

        async def jobs(request: Request) -> Response:
            if not authorized(request):
                return JSONResponse({"kind": "Status", "code": 401}, status_code=401)
            manifest = await request.json()
            name = manifest["metadata"]["name"]
            if name in self.jobs:
                return JSONResponse({"kind": "Status", "reason": "AlreadyExists", "code": 409}, status_code=409)
            self.jobs[name] = manifest
            self.created.append(manifest)
            return JSONResponse({**manifest, "status": {}}, status_code=201)

        async def job(request: Request) -> Response:
            name = request.path_params["name"]
            if name not in self.jobs:
                return JSONResponse({"kind": "Status", "code": 404}, status_code=404)
            if request.method == "DELETE":
                body = await request.json()
                assert body == {"propagationPolicy": "Background"}
                del self.jobs[name]
                self.deleted.append(name)
                return JSONResponse({"kind": "Status", "status": "Success"})
            self.polls[name] = self.polls.get(name, 0) + 1
            status: dict[str, Any] = {"active": 1}
            if self.outcome and self.polls[name] > self.polls_before_end:
                status = {"conditions": [{"type": self.outcome, "status": "True"}]}
            return JSONResponse({**self.jobs[name], "status": status})

        async def pods(request: Request) -> Response:
            job_name = request.query_params["labelSelector"].removeprefix("job-name=")
            items = [{"metadata": {"name": f"{job_name}-pod", "creationTimestamp": "2026-01-01T00:00:00Z"}}]
            return JSONResponse({"items": items if job_name in self.jobs else []})

        async def log(request: Request) -> Response:
            return PlainTextResponse(self.log)

        return Starlette(
            routes=[
                Route("/apis/batch/v1/namespaces/{ns}/jobs", jobs, methods=["POST"]),
                Route("/apis/batch/v1/namespaces/{ns}/jobs/{name}", job, methods=["GET", "DELETE"]),
                Route("/api/v1/namespaces/{ns}/pods", pods, methods=["GET"]),
                Route("/api/v1/namespaces/{ns}/pods/{pod}/log", log, methods=["GET"]),
            ]
        )
