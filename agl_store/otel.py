"""`span_from_otel`: an OpenTelemetry SDK span as a store Span (every store's `add_otel_span`)."""

from __future__ import annotations

from typing import Any

from .models import Event, Link, OtelResource, Span, SpanContext, TraceStatus


def span_from_otel(readable_span: Any, rollout_id: str, attempt_id: str, sequence_id: int | None) -> Span:
    """Convert an `opentelemetry.sdk.trace.ReadableSpan` into a Span of the attempt."""
    from opentelemetry import trace as trace_api

    def context(ctx: Any) -> SpanContext:
        return SpanContext(
            trace_id=trace_api.format_trace_id(ctx.trace_id),
            span_id=trace_api.format_span_id(ctx.span_id),
            is_remote=bool(ctx.is_remote),
            trace_state=dict(ctx.trace_state.items()) if ctx.trace_state else {},
        )

    def seconds(ns: int | None) -> float | None:
        return None if ns is None else ns / 1e9

    def plain(attributes: Any) -> dict[str, Any]:
        # OpenTelemetry keeps sequences as tuples; the span schema wants JSON arrays.
        return {k: list(v) if isinstance(v, tuple) else v for k, v in (attributes or {}).items()}

    own = None if (own_ctx := readable_span.get_span_context()) is None else context(own_ctx)
    parent = None if readable_span.parent is None else context(readable_span.parent)
    ids: dict[str, Any] = {"trace_id": own.trace_id, "span_id": own.span_id} if own else {}
    resource = readable_span.resource
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        **ids,
        parent_id=parent.span_id if parent else None,
        name=readable_span.name,
        status=TraceStatus(
            status_code=readable_span.status.status_code.name, description=readable_span.status.description
        ),
        attributes=plain(readable_span.attributes),
        events=[
            Event(name=e.name, attributes=plain(e.attributes), timestamp=seconds(e.timestamp))
            for e in readable_span.events
        ],
        links=[Link(context=context(link.context), attributes=plain(link.attributes)) for link in readable_span.links],
        start_time=seconds(readable_span.start_time),
        end_time=seconds(readable_span.end_time),
        context=own,
        parent=parent,
        resource=OtelResource(
            attributes=plain(resource.attributes if resource else {}),
            schema_url=(resource.schema_url if resource else "") or "",
        ),
    )
