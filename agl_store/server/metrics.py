"""Prometheus metrics of the store server, kept per app and rendered in the text format.

Requests are counted and timed per route template (`/v1/agl/rollouts/{rollout_id}`), so
the number of series stays bounded whatever ids clients send.
"""

from __future__ import annotations

import time
from bisect import bisect_left

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..models import ROLLOUT_STATUSES, StoreStatistics

PROMETHEUS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
UNMATCHED_ROUTE = "<unmatched>"


class _Histogram:
    __slots__ = ("count", "counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last slot is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1


class ServerMetrics:
    """Counters and histograms of one server; all updates happen on the event loop thread."""

    def __init__(self) -> None:
        self._requests: dict[tuple[str, str, int], int] = {}
        self._latency: dict[tuple[str, str], _Histogram] = {}
        self._spans_ingested = 0

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        self._requests[key] = self._requests.get(key, 0) + 1
        histogram = self._latency.get((route, method))
        if histogram is None:
            histogram = self._latency[(route, method)] = _Histogram()
        histogram.observe(seconds)

    def spans_ingested(self, count: int) -> None:
        self._spans_ingested += count

    def render(self, stats: StoreStatistics) -> str:
        """The Prometheus text exposition of these metrics plus the store's statistics."""
        lines: list[str] = [
            "# HELP agl_store_http_requests_total HTTP requests by route template, method and status.",
            "# TYPE agl_store_http_requests_total counter",
        ]
        for (route, method, status), value in sorted(self._requests.items()):
            lines.append(
                f'agl_store_http_requests_total{{route="{_escape(route)}",method="{method}",status="{status}"}} {value}'
            )
        lines += [
            "# HELP agl_store_http_request_duration_seconds Time to answer an HTTP request.",
            "# TYPE agl_store_http_request_duration_seconds histogram",
        ]
        for (route, method), histogram in sorted(self._latency.items()):
            labels = f'route="{_escape(route)}",method="{method}"'
            cumulative = 0
            for bound, count in zip((*LATENCY_BUCKETS, float("inf")), histogram.counts, strict=True):
                cumulative += count
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f'agl_store_http_request_duration_seconds_bucket{{{labels},le="{le}"}} {cumulative}')
            lines.append(f"agl_store_http_request_duration_seconds_sum{{{labels}}} {histogram.total}")
            lines.append(f"agl_store_http_request_duration_seconds_count{{{labels}}} {histogram.count}")
        lines += [
            "# HELP agl_store_spans_ingested_total Spans stored through this server (duplicates excluded).",
            "# TYPE agl_store_spans_ingested_total counter",
            f"agl_store_spans_ingested_total {self._spans_ingested}",
            "# HELP agl_store_rollouts Rollouts in the store by status.",
            "# TYPE agl_store_rollouts gauge",
        ]
        for rollout_status in ROLLOUT_STATUSES:
            count = stats.rollouts_by_status.get(rollout_status, 0)
            lines.append(f'agl_store_rollouts{{status="{rollout_status}"}} {count}')
        lines += [
            "# HELP agl_store_spans Spans in the store.",
            "# TYPE agl_store_spans gauge",
            f"agl_store_spans {stats.total_spans}",
            "# HELP agl_store_database_bytes Size of the store's database file and its WAL; 0 when in memory.",
            "# TYPE agl_store_database_bytes gauge",
            f"agl_store_database_bytes {stats.database_bytes or 0}",
            "# HELP agl_store_database_wal_bytes Of agl_store_database_bytes, the WAL file's.",
            "# TYPE agl_store_database_wal_bytes gauge",
            f"agl_store_database_wal_bytes {stats.wal_bytes or 0}",
            "# HELP agl_store_database_unused_bytes Free pages in the database file, reused by later writes.",
            "# TYPE agl_store_database_unused_bytes gauge",
            f"agl_store_database_unused_bytes {stats.unused_bytes or 0}",
        ]
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_of(request: Request) -> ServerMetrics:
    """The metrics of the app serving this request (created with the app)."""
    metrics: ServerMetrics = request.scope["state"]["agl_store_metrics"]
    return metrics


class MetricsMiddleware:
    """Pure ASGI: times every HTTP request and counts it under its route template."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED_ROUTE
            self.metrics.observe_request(template, scope["method"], status, time.perf_counter() - start)
