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
from agl_store.web.http_transport import AiohttpTransport

from ..backends.balancing import Balancer
from ..backends.base import RequestOptions
from ..backends.litellm_path import import_litellm
from ..backends.upstream import make_client, make_transport
from ..chain.engine import EngineProbes
from ..chain.engine_http import EngineHttp
from ..chain.heads import ChainHeads
from ..chain.memory import ChainMemory
from ..common.deployments import Deployment, ModelRegistry
from ..common.metrics import ProxyMetrics
from ..controls.pausing import PauseGate
from ..controls.sampling import SamplingPolicy
from ..recording.exporter import SpanExporter
from .settings import ProxySettings

logger = logging.getLogger(__name__)


class ProxyState:
    """Everything a call needs besides its own request."""

    def __init__(
        self,
        model_list: Sequence[Mapping[str, Any]] = (),
        store: LightningStore | None = None,
        settings: ProxySettings | None = None,
    ) -> None:
        self.settings = settings = settings or ProxySettings()
        self.registry = ModelRegistry(model_list)
        self.store = store
        self.sampling = SamplingPolicy(
            settings.sampling_overrides, settings.sampling_by_mode, store, settings.sampling_on_conflict
        )
        self.options = RequestOptions(logprobs=settings.logprobs, sampling_overrides=self.sampling.overrides)
        self.balancer = Balancer(cooldown_s=settings.cooldown_s)
        self.exporter = SpanExporter(
            store, max_buffer=settings.max_span_buffer, backpressure_wait_s=settings.backpressure_wait_s
        )
        self.metrics = ProxyMetrics()
        self.gate = PauseGate(retry_after_s=settings.retry_after_s, hold_s=settings.hold_s)
        self.metrics.histograms["agl_proxy_hold_seconds"] = (
            "How long calls that arrived during a pause were held.",
            self.gate.hold_time,
        )
        self.chains = ChainMemory(store)
        """The token chain's remembered calls, per attempt."""
        self.engines = EngineProbes()
        """Which deployments take token ids, probed once each."""
        self.heads = ChainHeads()
        """The token chain's head renderings (system message, tools), so a bridge renders once."""
        self.engine_http = EngineHttp()
        """The token chain's connections to the engines (JSON requests answered whole)."""
        self.client: httpx.AsyncClient | None = None
        self.transport: AiohttpTransport | None = None
        """The client's transport, opened and closed with it."""

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

    def current_deployment(self, deployment: Deployment) -> Deployment:
        """`deployment` as the model list has it now (`ModelRegistry.current`)."""
        return self.registry.current(deployment)

    async def open(self) -> None:
        self.transport = make_transport()
        self.client = make_client(self.transport)
        await self.exporter.start()
        if self.registry.needs_litellm:
            # Seconds of CPU: pay them at start, in a thread, not on the first call.
            await asyncio.to_thread(import_litellm)

    async def close(self) -> None:
        await self.exporter.stop()
        if self.client is not None:
            await self.client.aclose()
            self.client = None
            self.transport = None
        await self.engine_http.aclose()

    def gauges(self) -> dict[str, Any]:
        """The gauge part of `/metrics`: name -> (help, read function)."""
        return {
            "agl_proxy_in_flight": ("LLM calls in flight.", lambda: self.gate.in_flight),
            "agl_proxy_paused": ("1 while the proxy holds new calls.", lambda: int(self.gate.paused)),
            "agl_proxy_held_calls": ("Calls waiting for the proxy to resume.", lambda: self.gate.held),
            "agl_proxy_hold_refusals_total": (
                "Calls refused with 429 because the pause outlasted the hold bound.",
                lambda: self.gate.refused_after_hold,
            ),
            "agl_proxy_held_calls_gone_total": (
                "Calls whose client went away while they were held.",
                lambda: self.gate.left_while_held,
            ),
            "agl_proxy_cancelled_calls_total": (
                "Calls in flight cancelled because a pause's drain timed out.",
                lambda: self.gate.cancelled_calls,
            ),
            "agl_proxy_parked_calls": (
                "Token-chain calls whose generation a weight update stopped, waiting for the resume.",
                lambda: self.gate.parked,
            ),
            "agl_proxy_continued_calls_total": (
                "Token-chain generations continued after a weight update (each choice, each update).",
                lambda: self.gate.continued_calls,
            ),
            "agl_proxy_continued_tokens_kept_total": (
                "Ids sampled before a weight update that continued calls kept (not generated again).",
                lambda: self.gate.continued_tokens_kept,
            ),
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
            "agl_proxy_chain_calls_kept": (
                "Calls the token chain remembers (all attempts).",
                lambda: self.chains.entries,
            ),
            "agl_proxy_chain_kept_size": (
                "Ids and digests the token chain keeps (bounded).",
                lambda: self.chains.size,
            ),
            "agl_proxy_chain_store_reads_total": (
                "Reads of an attempt's calls from the store by the token chain.",
                lambda: self.chains.store_reads,
            ),
            "agl_proxy_span_export_failures_total": (
                "Failed span export attempts (retried).",
                lambda: self.exporter.failed_attempts,
            ),
        }
