"""Prometheus metrics of the proxy, kept per instance and rendered as text.

Hand-written rather than `prometheus_client` because that library's default registry is
process-global, and two proxies in one process (as in tests) must not share counters.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)

_Labels = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: tuple[str, ...], values: _Labels, extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class ProxyMetrics:
    """Calls, errors and latency per model and backend; gauges read at render time."""

    def __init__(self) -> None:
        self.calls: dict[_Labels, int] = {}
        self.errors: dict[_Labels, int] = {}
        self._latency_counts: dict[_Labels, list[int]] = {}
        self._latency_sums: dict[_Labels, float] = {}
        self._ttft_counts: dict[_Labels, list[int]] = {}
        self._ttft_sums: dict[_Labels, float] = {}

    def observe_call(self, model: str, backend: str, status_code: int, latency_s: float, ttft_s: float | None) -> None:
        key = (model, backend, str(status_code))
        self.calls[key] = self.calls.get(key, 0) + 1
        self._observe(self._latency_counts, self._latency_sums, (model, backend), latency_s)
        if ttft_s is not None:
            self._observe(self._ttft_counts, self._ttft_sums, (model, backend), ttft_s)

    def observe_error(self, model: str, backend: str, error_type: str) -> None:
        key = (model, backend, error_type)
        self.errors[key] = self.errors.get(key, 0) + 1

    @staticmethod
    def _observe(counts: dict[_Labels, list[int]], sums: dict[_Labels, float], key: _Labels, value: float) -> None:
        buckets = counts.get(key)
        if buckets is None:
            buckets = counts[key] = [0] * (len(LATENCY_BUCKETS_S) + 1)
        buckets[bisect.bisect_left(LATENCY_BUCKETS_S, value)] += 1
        sums[key] = sums.get(key, 0.0) + value

    def render(self, gauges: dict[str, tuple[str, Callable[[], float]]]) -> str:
        """Prometheus text format; `gauges` maps name to (help, read function)."""
        lines: list[str] = []
        lines += [
            "# HELP agl_proxy_calls_total LLM calls by model, backend and HTTP status.",
            "# TYPE agl_proxy_calls_total counter",
        ]
        for key, value in self.calls.items():
            lines.append(f"agl_proxy_calls_total{_labels(('model', 'backend', 'status'), key)} {value}")
        lines += [
            "# HELP agl_proxy_errors_total Failed LLM calls by model, backend and error type.",
            "# TYPE agl_proxy_errors_total counter",
        ]
        for key, value in self.errors.items():
            lines.append(f"agl_proxy_errors_total{_labels(('model', 'backend', 'type'), key)} {value}")
        self._render_histogram(
            lines, "agl_proxy_call_latency_seconds", "Latency of LLM calls.", self._latency_counts, self._latency_sums
        )
        self._render_histogram(
            lines,
            "agl_proxy_ttft_seconds",
            "Time to first token of streamed calls.",
            self._ttft_counts,
            self._ttft_sums,
        )
        for name, (help_text, read) in gauges.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {read():g}"]
        return "\n".join(lines) + "\n"

    @staticmethod
    def _render_histogram(
        lines: list[str], name: str, help_text: str, counts: dict[_Labels, list[int]], sums: dict[_Labels, float]
    ) -> None:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        names = ("model", "backend")
        for key, buckets in counts.items():
            cumulative = 0
            for bound, count in zip(LATENCY_BUCKETS_S, buckets[:-1], strict=True):
                cumulative += count
                le = f'le="{bound:g}"'
                lines.append(f"{name}_bucket{_labels(names, key, le)} {cumulative}")
            cumulative += buckets[-1]
            inf = 'le="+Inf"'
            lines.append(f"{name}_bucket{_labels(names, key, inf)} {cumulative}")
            lines.append(f"{name}_sum{_labels(names, key)} {sums[key]:.6f}")
            lines.append(f"{name}_count{_labels(names, key)} {cumulative}")
