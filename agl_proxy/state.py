"""The proxy's shared state: backends, balancing, span export, metrics, pause gate.

One `ProxyState` per proxy; handlers receive it from `create_app`, never from a global. The
upstream HTTP client is opened in the app's lifespan (`open()`) and closed with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from agl_store.base import LightningStore

from .balancing import DEFAULT_COOLDOWN_S, Balancer
from .deployments import ModelRegistry
from .exporter import DEFAULT_BACKPRESSURE_WAIT_S, DEFAULT_MAX_BUFFER, SpanExporter
from .forwarding import RequestOptions
from .litellm_path import import_litellm
from .metrics import ProxyMetrics
from .pausing import PauseGate
from .sampling import SamplingPolicy
from .upstream import make_client

logger = logging.getLogger(__name__)


class ProxyState:
    """Everything a call needs besides its own request."""

    def __init__(
        self,
        model_list: Sequence[Mapping[str, Any]] = (),
        store: LightningStore | None = None,
        *,
        logprobs: bool = False,
        sampling_overrides: Mapping[str, Any] | None = None,
        sampling_by_mode: Mapping[str, Mapping[str, Any]] | None = None,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        max_span_buffer: int = DEFAULT_MAX_BUFFER,
        backpressure_wait_s: float = DEFAULT_BACKPRESSURE_WAIT_S,
    ) -> None:
        self.registry = ModelRegistry(model_list)
        self.store = store
        self.sampling = SamplingPolicy(sampling_overrides, sampling_by_mode, store)
        self.options = RequestOptions(logprobs=logprobs, sampling_overrides=self.sampling.overrides)
        self.balancer = Balancer(cooldown_s=cooldown_s)
        self.exporter = SpanExporter(store, max_buffer=max_span_buffer, backpressure_wait_s=backpressure_wait_s)
        self.metrics = ProxyMetrics()
        self.gate = PauseGate()
        self.client: httpx.AsyncClient | None = None

    async def options_for(self, rollout_id: str) -> RequestOptions:
        """What to add to a call of `rollout_id`."""
        if not self.sampling.needs_rollout:
            return self.options
        overrides = await self.sampling.for_rollout(rollout_id)
        return RequestOptions(logprobs=self.options.logprobs, sampling_overrides=overrides)

    async def latest_attempt_id(self, rollout_id: str) -> str:
        """The rollout's latest attempt, for calls that name only `x-rollout-id` ("" if unknown)."""
        if self.store is None:
            return ""
        try:
            attempt = await self.store.get_latest_attempt(rollout_id)
        except Exception as exc:  # the call goes on; the store will reject its span (counted)
            logger.warning("agl_proxy: cannot find the latest attempt of rollout %r: %r", rollout_id, exc)
            return ""
        return attempt.attempt_id if attempt is not None else ""

    def update_model_list(self, model_list: Sequence[Mapping[str, Any]]) -> None:
        """Replace the backends. Calls in flight finish on the deployment they started on."""
        # Parse first: a bad list raises and leaves the current one serving.
        self.registry = ModelRegistry(model_list)
        logger.info("agl_proxy serves models: %s", ", ".join(self.registry.model_names) or "(none)")

    async def open(self) -> None:
        self.client = make_client()
        await self.exporter.start()
        if self.registry.needs_litellm:
            # Seconds of CPU: pay them at start, in a thread, not on the first call.
            await asyncio.to_thread(import_litellm)

    async def close(self) -> None:
        await self.exporter.stop()
        if self.client is not None:
            await self.client.aclose()
            self.client = None

    def gauges(self) -> dict[str, Any]:
        """The gauge part of `/metrics`: name -> (help, read function)."""
        return {
            "agl_proxy_in_flight": ("LLM calls in flight.", lambda: self.gate.in_flight),
            "agl_proxy_paused": ("1 while the proxy refuses new calls.", lambda: int(self.gate.paused)),
            "agl_proxy_spans_exported_total": ("Spans written to the store.", lambda: self.exporter.exported),
            "agl_proxy_spans_buffered": (
                "Spans of answered calls not written to the store yet.",
                lambda: self.exporter.buffered,
            ),
            "agl_proxy_span_buffer_limit": (
                "Spans buffered at which new calls wait (backpressure).",
                lambda: self.exporter.max_buffer,
            ),
            "agl_proxy_backpressure_waits_total": (
                "Calls that waited for the span backlog to shrink before starting.",
                lambda: self.exporter.waited_calls,
            ),
            "agl_proxy_backpressure_refusals_total": (
                "Calls refused with 503 because the span backlog stayed full.",
                lambda: self.exporter.refused_calls,
            ),
            "agl_proxy_spans_rejected_total": (
                "Spans the store refused (unknown rollout or attempt).",
                lambda: self.exporter.rejected,
            ),
            "agl_proxy_span_export_failures_total": (
                "Failed span export attempts (retried).",
                lambda: self.exporter.failed_attempts,
            ),
        }
