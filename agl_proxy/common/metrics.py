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


class Histogram:
    """A Prometheus histogram of one series: counts per bucket and the sum."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def render(self, name: str, label_names: tuple[str, ...] = (), label_values: _Labels = ()) -> list[str]:
        """The `_bucket`, `_sum` and `_count` lines of this series."""
        lines = []
        cumulative = 0
        for bound, count in zip(self.buckets, self.counts[:-1], strict=True):
            cumulative += count
            le = f'le="{bound:g}"'
            lines.append(f"{name}_bucket{_labels(label_names, label_values, le)} {cumulative}")
        cumulative += self.counts[-1]
        inf = 'le="+Inf"'
        lines.append(f"{name}_bucket{_labels(label_names, label_values, inf)} {cumulative}")
        lines.append(f"{name}_sum{_labels(label_names, label_values)} {self.sum:.6f}")
        lines.append(f"{name}_count{_labels(label_names, label_values)} {cumulative}")
        return lines


def help_lines(name: str, help_text: str, kind: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]


class ProxyMetrics:
    """Calls, errors and latency per model and backend; gauges read at render time."""

    def __init__(self) -> None:
        self.calls: dict[_Labels, int] = {}
        self.errors: dict[_Labels, int] = {}
        self.token_ids: dict[_Labels, int] = {}
        self._latency: dict[_Labels, Histogram] = {}
        self._ttft: dict[_Labels, Histogram] = {}
        self.histograms: dict[str, tuple[str, Histogram]] = {}
        """Unlabelled histograms owned elsewhere (the pause gate's hold time): name -> (help, histogram)."""

    def observe_call(self, model: str, backend: str, status_code: int, latency_s: float, ttft_s: float | None) -> None:
        key = (model, backend, str(status_code))
        self.calls[key] = self.calls.get(key, 0) + 1
        self._series(self._latency, (model, backend)).observe(latency_s)
        if ttft_s is not None:
            self._series(self._ttft, (model, backend)).observe(ttft_s)

    def observe_error(self, model: str, backend: str, error_type: str) -> None:
        key = (model, backend, error_type)
        self.errors[key] = self.errors.get(key, 0) + 1

    def observe_token_ids(self, backend: str, status: str) -> None:
        key = (backend, status)
        self.token_ids[key] = self.token_ids.get(key, 0) + 1

    @staticmethod
    def _series(series: dict[_Labels, Histogram], key: _Labels) -> Histogram:
        histogram = series.get(key)
        if histogram is None:
            histogram = series[key] = Histogram()
        return histogram

    def render(self, gauges: dict[str, tuple[str, Callable[[], float]]]) -> str:
        """Prometheus text format; `gauges` maps name to (help, read function)."""
        lines: list[str] = []
        lines += help_lines("agl_proxy_calls_total", "LLM calls by model, backend and HTTP status.", "counter")
        for key, value in self.calls.items():
            lines.append(f"agl_proxy_calls_total{_labels(('model', 'backend', 'status'), key)} {value}")
        lines += help_lines("agl_proxy_errors_total", "Failed LLM calls by model, backend and error type.", "counter")
        for key, value in self.errors.items():
            lines.append(f"agl_proxy_errors_total{_labels(('model', 'backend', 'type'), key)} {value}")
        lines += help_lines(
            "agl_proxy_token_ids_total",
            "Answered calls by backend and token-id status (ok, missing, mismatch).",
            "counter",
        )
        for key, value in self.token_ids.items():
            lines.append(f"agl_proxy_token_ids_total{_labels(('backend', 'status'), key)} {value}")
        for name, help_text, series in (
            ("agl_proxy_call_latency_seconds", "Latency of LLM calls.", self._latency),
            ("agl_proxy_ttft_seconds", "Time to first token of streamed calls.", self._ttft),
        ):
            lines += help_lines(name, help_text, "histogram")
            for key, histogram in series.items():
                lines += histogram.render(name, ("model", "backend"), key)
        for name, (help_text, histogram) in self.histograms.items():
            lines += help_lines(name, help_text, "histogram")
            lines += histogram.render(name)
        for name, (help_text, read) in gauges.items():
            lines += help_lines(name, help_text, "counter" if name.endswith("_total") else "gauge")
            lines.append(f"{name} {read():g}")
        return "\n".join(lines) + "\n"
