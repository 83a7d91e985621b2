"""OTLP/HTTP trace ingest (`POST /v1/traces`), protobuf and JSON.

Each OTLP span names its rollout, attempt and (optionally) sequence number in span or
resource attributes (span wins); both agl's and agent-lightning 0.3's names are read.
Spans without a rollout and attempt are rejected through OTLP's `partial_success`; the
rest are stored in one transaction.
"""

from __future__ import annotations

import base64
import time
import zlib
from collections.abc import Iterable
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..bounds import check_integer, check_json_depth
from ..errors import InvalidInputError, PayloadTooLargeError
from ..models import Event, Link, OtelResource, Span, SpanContext, TraceStatus
from ..web.wire import endpoint, store_of
from .metrics import metrics_of

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
ROLLOUT_ID_KEYS = ("agl.rollout_id", "agentlightning.rollout_id")
ATTEMPT_ID_KEYS = ("agl.attempt_id", "agentlightning.attempt_id")
SEQUENCE_ID_KEYS = ("agl.sequence_id", "agentlightning.span_sequence_id")
_STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}
# OTLP/JSON writes these bytes fields as hex, where protobuf's JSON mapping expects base64.
_HEX_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


def any_value(value: AnyValue) -> Any:
    """An OTLP AnyValue as plain JSON: arrays become lists (of ints, for token ids)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return key_values(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, kind)


def key_values(items: Iterable[KeyValue]) -> dict[str, Any]:
    return {item.key: any_value(item.value) for item in items}


def _first(attributes: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = attributes.get(key)
        if value is not None:
            return value
    return None


def _seconds(unix_nano: int) -> float | None:
    return unix_nano / 1e9 if unix_nano else None


def _sequence_id(value: Any) -> int | None:
    """A usable sequence id (0 included, as agent-lightning 0.3 keeps it), or None to let the
    store issue one (for a negative one too, as 0.3 does).

    OTLP attributes may carry it as a double (JavaScript exporters do): a whole one is
    taken, one with a fraction, infinite or NaN is not.
    """
    if value is None or isinstance(value, bool):
        return None
    try:
        number = int(value)
        if isinstance(value, float) and number != value:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise InvalidInputError(f"sequence id attribute must be an integer, got {value!r}") from None
    return check_integer(number, "sequence id attribute") if number >= 0 else None


def _trace_state(raw: str) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in raw.split(",") if "=" in item)
    return {key.strip(): value.strip() for key, value in pairs}


def _span(proto: ProtoSpan, resource_attrs: dict[str, Any], resource: OtelResource) -> Span | None:
    attributes = key_values(proto.attributes)
    rollout_id = _first(attributes, ROLLOUT_ID_KEYS) or _first(resource_attrs, ROLLOUT_ID_KEYS)
    attempt_id = _first(attributes, ATTEMPT_ID_KEYS) or _first(resource_attrs, ATTEMPT_ID_KEYS)
    if not rollout_id or not attempt_id:
        return None
    sequence = _first(attributes, SEQUENCE_ID_KEYS)
    trace_id, span_id = proto.trace_id.hex(), proto.span_id.hex()
    return Span(
        rollout_id=str(rollout_id),
        attempt_id=str(attempt_id),
        sequence_id=_sequence_id(sequence if sequence is not None else _first(resource_attrs, SEQUENCE_ID_KEYS)),
        trace_id=trace_id,
        span_id=span_id,
        parent_id=proto.parent_span_id.hex() or None,
        name=proto.name,
        status=TraceStatus(
            status_code=_STATUS_CODES.get(proto.status.code, "UNSET"),  # type: ignore[arg-type]
            description=proto.status.message or None,
        ),
        attributes=attributes,
        events=[
            Event(name=event.name, attributes=key_values(event.attributes), timestamp=_seconds(event.time_unix_nano))
            for event in proto.events
        ],
        links=[
            Link(
                context=SpanContext(trace_id=link.trace_id.hex(), span_id=link.span_id.hex()),
                attributes=key_values(link.attributes) or None,
            )
            for link in proto.links
        ],
        start_time=_seconds(proto.start_time_unix_nano),
        end_time=_seconds(proto.end_time_unix_nano),
        context=SpanContext(trace_id=trace_id, span_id=span_id, trace_state=_trace_state(proto.trace_state)),
        resource=resource,
    )


def spans_from_request(request: ExportTraceServiceRequest) -> tuple[list[Span], int]:
    """The request's spans as store spans, and how many were rejected for lacking ids."""
    spans: list[Span] = []
    rejected = 0
    for resource_spans in request.resource_spans:
        resource_attrs = key_values(resource_spans.resource.attributes)
        resource = OtelResource(attributes=resource_attrs, schema_url=resource_spans.schema_url)
        for scope_spans in resource_spans.scope_spans:
            for proto in scope_spans.spans:
                span = _span(proto, resource_attrs, resource)
                if span is None:
                    rejected += 1
                else:
                    spans.append(span)
    return spans, rejected


def _hex_ids_to_base64(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: _hex_to_base64(value)
            if key in _HEX_ID_FIELDS and isinstance(value, str)
            else _hex_ids_to_base64(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids_to_base64(item) for item in node]
    return node


def _hex_to_base64(value: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except ValueError:
        raise InvalidInputError(f"OTLP/JSON ids must be hex strings, got {value!r}") from None


def parse_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """Decode an ExportTraceServiceRequest from protobuf or OTLP/JSON bytes."""
    message = ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            raise InvalidInputError(f"unparseable OTLP protobuf trace request: {exc}") from None
        return message
    try:
        document = orjson.loads(body) if body.strip() else {}
        check_json_depth(document, "OTLP/JSON body")  # before walking it recursively
        json_format.ParseDict(_hex_ids_to_base64(document), message, ignore_unknown_fields=True)
    except (orjson.JSONDecodeError, json_format.ParseError, TypeError, AttributeError) as exc:
        raise InvalidInputError(f"unparseable OTLP/JSON trace request: {exc}") from None
    return message


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
MAX_GZIP_MEMBERS = 100
"""Gzip bodies may be several members back to back; exporters send one. Each member costs
a decoder, so a body of 200,000 empty members was seconds of work for nothing."""
DECOMPRESS_SECONDS = 5.0
"""Longest a body may take to decompress (64 MiB of output takes well under a second)."""
_CHUNK_BYTES = 64 * 1024
"""Compressed bytes fed to the decoder at a time: what a finished member leaves over is
copied, so whole-body feeds made many small members cost quadratic time."""


def decompress(
    body: bytes,
    encoding: str,
    max_bytes: int,
    *,
    max_members: int = MAX_GZIP_MEMBERS,
    seconds: float = DECOMPRESS_SECONDS,
) -> bytes:
    """The body decoded; over `max_bytes` once decoded, or taking over `seconds`, is a 413,
    more than `max_members` gzip members a 400.

    The size limit middleware sees only the compressed bytes: a small gzip bomb would
    otherwise expand without bound. CPU-bound: the route runs it on a worker thread.
    """
    if encoding in ("", "identity"):
        return body
    if encoding not in _WBITS:
        raise InvalidInputError(f"unsupported Content-Encoding {encoding!r}; use gzip, deflate or none")
    if encoding == "gzip" and not body:
        return body  # as gzip.decompress had it: zero members
    deadline = time.monotonic() + seconds
    view = memoryview(body)
    parts: list[bytes] = []
    size = position = members = 0
    try:
        while True:  # one round per gzip member (gzip.decompress reads them all too)
            members += 1
            if members > max_members:
                raise InvalidInputError(f"gzip body of more than {max_members} members; send one")
            decoder = zlib.decompressobj(_WBITS[encoding])
            while not decoder.eof:
                if position >= len(body):
                    raise InvalidInputError(f"body is not valid {encoding}: compressed data ended early")
                if time.monotonic() > deadline:
                    raise PayloadTooLargeError(f"request body took over {seconds:g} s to decompress")
                chunk = view[position : position + _CHUNK_BYTES]
                position += len(chunk)
                # Output capped one byte past the limit: reaching the cap is going over it.
                part = decoder.decompress(chunk, max_bytes + 1 - size)
                size += len(part)
                if size > max_bytes:
                    raise PayloadTooLargeError(f"request body is over the limit of {max_bytes} bytes once decompressed")
                parts.append(part)
            position -= len(decoder.unused_data)  # where the next member starts
            if encoding == "deflate" or position >= len(body):
                break
    except zlib.error as exc:
        raise InvalidInputError(f"body is not valid {encoding}: {exc}") from None
    return b"".join(parts)


def decode_request(body: bytes, content_type: str, encoding: str, max_body_bytes: int) -> tuple[list[Span], int]:
    """A raw `/v1/traces` body as store spans and the count rejected for lacking ids."""
    return spans_from_request(parse_request(decompress(body, encoding, max_body_bytes), content_type))


async def export_traces(request: Request, max_body_bytes: int) -> Response:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in (PROTOBUF, JSON):
        raise InvalidInputError(f"unsupported Content-Type {content_type!r}; expected {PROTOBUF!r} or {JSON!r}")
    encoding = request.headers.get("content-encoding", "").strip().lower()
    body = await request.body()
    # Decompressing and parsing up to the body limit is CPU work: off the event loop, so
    # other requests (and /health) are answered meanwhile.
    spans, rejected = await run_in_threadpool(decode_request, body, content_type, encoding, max_body_bytes)
    stored = await store_of(request).add_many_spans(spans) if spans else []
    metrics_of(request).spans_ingested(len(stored))
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = (
            f"{rejected} span(s) name no rollout and attempt: set the span or resource attributes "
            f"{ROLLOUT_ID_KEYS[0]!r} and {ATTEMPT_ID_KEYS[0]!r}"
        )
    if content_type == PROTOBUF:
        return Response(response.SerializeToString(), media_type=PROTOBUF)
    return Response(json_format.MessageToJson(response).encode(), media_type=JSON)


async def not_implemented(request: Request) -> Response:
    return Response(status_code=501)


def routes(max_body_bytes: int) -> list[Route]:
    """`/v1/traces`, refusing bodies over `max_body_bytes` once decompressed; the other OTLP
    signals answer 501 as agent-lightning 0.3's do."""

    async def traces(request: Request) -> Response:
        return await export_traces(request, max_body_bytes)

    return [
        endpoint("/v1/traces", traces, methods=["POST"]),
        endpoint("/v1/logs", not_implemented, methods=["POST"]),
    ]
