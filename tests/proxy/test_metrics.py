"""Prometheus text of the proxy's metrics."""

from __future__ import annotations

from agl_proxy.common.metrics import ProxyMetrics


def test_render_counts_histograms_and_gauges() -> None:
    metrics = ProxyMetrics()
    metrics.observe_call("tiny", "http://a/v1", 200, 0.02, 0.01)
    metrics.observe_call("tiny", "http://a/v1", 200, 3.0, None)
    metrics.observe_error("tiny", 'http://"b"/v1', "backend_timeout")
    text = metrics.render({"agl_proxy_in_flight": ("Calls in flight.", lambda: 3)})
    assert 'agl_proxy_calls_total{model="tiny",backend="http://a/v1",status="200"} 2' in text
    assert 'agl_proxy_errors_total{model="tiny",backend="http://\\"b\\"/v1",type="backend_timeout"} 1' in text
    assert 'agl_proxy_call_latency_seconds_bucket{model="tiny",backend="http://a/v1",le="0.025"} 1' in text
    assert 'agl_proxy_call_latency_seconds_bucket{model="tiny",backend="http://a/v1",le="+Inf"} 2' in text
    assert 'agl_proxy_call_latency_seconds_count{model="tiny",backend="http://a/v1"} 2' in text
    assert 'agl_proxy_ttft_seconds_count{model="tiny",backend="http://a/v1"} 1' in text
    assert "# TYPE agl_proxy_in_flight gauge\nagl_proxy_in_flight 3" in text
