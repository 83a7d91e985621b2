"""OTLP/HTTP trace ingest: decoding protobuf and OTLP/JSON requests, and `/v1/traces` end to end."""

from __future__ import annotations

import asyncio
import base64
import gzip
import zlib
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from agl_store.bounds import MAX_INTEGER
from agl_store.errors import InvalidInputError, PayloadTooLargeError
from agl_store.server.otlp import MAX_GZIP_MEMBERS, decompress, parse_request, spans_from_request

from .http_server import StoreServerProcess, start_store_server

TRACE_ID = bytes(range(16))


def attr(key: str, value: Any) -> KeyValue:
    return KeyValue(key=key, value=to_any(value))


def to_any(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[to_any(v) for v in value]))
    if isinstance(value, dict):
        return AnyValue(kvlist_value=KeyValueList(values=[attr(k, v) for k, v in value.items()]))
    return AnyValue(string_value=value)


def proto_span(span_number: int, name: str = "agl.llm_call", **attributes: Any) -> ProtoSpan:
    return ProtoSpan(
        trace_id=TRACE_ID,
        span_id=span_number.to_bytes(8, "big"),
        name=name,
        start_time_unix_nano=1_700_000_000_000_000_000 + span_number,
        end_time_unix_nano=1_700_000_001_500_000_000,
        status=Status(code=Status.STATUS_CODE_OK),
        attributes=[attr(k, v) for k, v in attributes.items()],
    )


def export_request(resource_attributes: dict[str, Any], spans: list[ProtoSpan]) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=[attr(k, v) for k, v in resource_attributes.items()]),
                scope_spans=[ScopeSpans(spans=spans)],
            )
        ]
    )


def otlp_json(request: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON as exporters write it: protobuf's JSON mapping, but ids in hex."""
    document = json_format.MessageToDict(request)

    def hexify(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else hexify(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [hexify(item) for item in node]
        return node

    return orjson.dumps(hexify(document))


def test_ids_come_from_resource_attributes_and_span_attributes_override_them() -> None:
    request = export_request(
        {"agl.rollout_id": "ro-1", "agl.attempt_id": "at-1"},
        [proto_span(1), proto_span(2, **{"agl.attempt_id": "at-2", "agl.sequence_id": 9})],
    )
    spans, rejected = spans_from_request(request)
    assert rejected == 0
    assert [(s.rollout_id, s.attempt_id, s.sequence_id) for s in spans] == [("ro-1", "at-1", None), ("ro-1", "at-2", 9)]
    assert spans[0].trace_id == TRACE_ID.hex()
    assert spans[0].span_id == "0000000000000001"
    assert spans[0].status.status_code == "OK"
    assert spans[0].start_time == pytest.approx(1_700_000_000.0)


def test_agent_lightning_attribute_names_are_read() -> None:
    request = export_request(
        {"agentlightning.rollout_id": "ro-al"},
        [
            proto_span(n, **{"agentlightning.attempt_id": "at-al", "agentlightning.span_sequence_id": sequence})
            for n, sequence in ((1, "5"), (2, "0"), (3, "-1"))
        ],
    )
    spans, _ = spans_from_request(request)
    assert [(s.rollout_id, s.attempt_id, s.sequence_id) for s in spans] == [
        ("ro-al", "at-al", 5),
        ("ro-al", "at-al", 0),  # kept, as agent-lightning 0.3 keeps it
        ("ro-al", "at-al", None),  # negative: the store issues one
    ]


def test_attribute_values_become_native_json() -> None:
    request = export_request(
        {"agl.rollout_id": "r", "agl.attempt_id": "a", "service.name": "agent"},
        [
            proto_span(
                1,
                **{
                    "agl.prompt_token_ids": [151644, 872, 198],
                    "gen_ai.usage.input_tokens": 3,
                    "agl.stream": False,
                    "agl.latency_s": 0.25,
                    "agl.request": {"model": "m", "n": 1},
                },
            )
        ],
    )
    (span,), _ = spans_from_request(request)
    assert span.attributes["agl.prompt_token_ids"] == [151644, 872, 198]
    assert span.attributes["gen_ai.usage.input_tokens"] == 3
    assert span.attributes["agl.stream"] is False
    assert span.attributes["agl.latency_s"] == 0.25
    assert span.attributes["agl.request"] == {"model": "m", "n": 1}
    assert span.resource.attributes["service.name"] == "agent"


def test_spans_without_rollout_and_attempt_are_rejected_not_guessed() -> None:
    request = export_request({"agl.rollout_id": "r"}, [proto_span(1), proto_span(2, **{"agl.attempt_id": "a"})])
    spans, rejected = spans_from_request(request)
    assert rejected == 1
    assert [s.span_id for s in spans] == ["0000000000000002"]


def test_otlp_json_decodes_like_protobuf() -> None:
    request = export_request({"agl.rollout_id": "r", "agl.attempt_id": "a"}, [proto_span(1, x=[1, 2])])
    from_json, _ = spans_from_request(parse_request(otlp_json(request), "application/json"))
    from_proto, _ = spans_from_request(parse_request(request.SerializeToString(), "application/x-protobuf"))
    assert (
        from_json[0].model_dump(exclude={"trace_id"}) | {"trace_id": from_json[0].trace_id}
        == from_proto[0].model_dump()
    )
    assert from_json[0].attributes["x"] == [1, 2]


async def test_traces_endpoint_stores_protobuf_and_json_spans(tmp_path: Path) -> None:
    async with start_store_server(tmp_path / "store.db") as store:
        attempted = await store.start_rollout(input={"q": 1})
        ids = {"agl.rollout_id": attempted.rollout_id, "agl.attempt_id": attempted.attempt.attempt_id}
        proto_body = export_request(ids, [proto_span(1), proto_span(2, **{"agl.prompt_token_ids": [7, 8, 9]})])
        json_body = export_request({**ids, "agl.attempt_id": "latest"}, [proto_span(3, name="tool")])
        async with httpx.AsyncClient(base_url=store.url) as http:
            answer = await http.post(
                "/v1/traces",
                content=proto_body.SerializeToString(),
                headers={"content-type": "application/x-protobuf"},
            )
            assert answer.status_code == 200
            assert answer.headers["content-type"] == "application/x-protobuf"
            assert not ExportTraceServiceResponse.FromString(answer.content).HasField("partial_success")
            answer = await http.post(
                "/v1/traces",
                content=gzip.compress(otlp_json(json_body)),
                headers={"content-type": "application/json", "content-encoding": "gzip"},
            )
            assert answer.status_code == 200, answer.text
        spans = await store.query_spans(attempted.rollout_id)
        assert [s.name for s in spans] == ["agl.llm_call", "agl.llm_call", "tool"]
        assert {s.attempt_id for s in spans} == {attempted.attempt.attempt_id}  # "latest" is stored as the attempt
        assert [s.sequence_id for s in spans] == sorted({s.sequence_id for s in spans})
        assert spans[1].attributes["agl.prompt_token_ids"] == [7, 8, 9]


async def test_partial_success_reports_spans_without_ids(tmp_path: Path) -> None:
    async with start_store_server(tmp_path / "store.db") as store:
        attempted = await store.start_rollout(input={"q": 1})
        good = proto_span(1, **{"agl.rollout_id": attempted.rollout_id, "agl.attempt_id": attempted.attempt.attempt_id})
        body = export_request({}, [good, proto_span(2)])
        async with httpx.AsyncClient(base_url=store.url) as http:
            answer = await http.post(
                "/v1/traces", content=body.SerializeToString(), headers={"content-type": "application/x-protobuf"}
            )
        partial = ExportTraceServiceResponse.FromString(answer.content).partial_success
        assert answer.status_code == 200
        assert partial.rejected_spans == 1
        assert "agl.rollout_id" in partial.error_message
        assert len(await store.query_spans(attempted.rollout_id)) == 1


@pytest.mark.parametrize(
    ("content_type", "body", "message"),
    [
        ("application/x-protobuf", b"\xff\xff\xff\xffnot protobuf", "unparseable OTLP protobuf"),
        ("application/json", b"{not json", "unparseable OTLP/JSON"),
        ("text/plain", b"hello", "unsupported Content-Type"),
        # Walked recursively: 1000 levels was a RecursionError.
        ("application/json", b'{"resourceSpans":' + b"[" * 1000 + b"]" * 1000 + b"}", "OTLP/JSON body nests deeper"),
    ],
)
async def test_bad_trace_requests_get_400_and_store_nothing(
    tmp_path: Path, content_type: str, body: bytes, message: str
) -> None:
    async with start_store_server(tmp_path / "store.db") as store:
        async with httpx.AsyncClient(base_url=store.url) as http:
            answer = await http.post("/v1/traces", content=body, headers={"content-type": content_type})
        assert answer.status_code == 400
        assert message in answer.json()["error"]["message"]
        assert (await store.statistics()).total_spans == 0


async def test_a_compressed_body_is_held_to_the_size_limit_once_decompressed(tmp_path: Path) -> None:
    # A few hundred compressed bytes that would expand past the limit: 413, like a plain body.
    server = StoreServerProcess(tmp_path / "store.db", extra_args=["--max-body-bytes", "100000"])
    await server.start()
    try:
        whole = gzip.compress(b"{}")
        cases = [
            ("gzip", gzip.compress(b" " * 100_001), 413, "once decompressed"),
            ("deflate", zlib.compress(b" " * 100_001), 413, "once decompressed"),
            ("gzip", whole[: len(whole) // 2], 400, "not valid gzip"),
            ("gzip", gzip.compress(b"{") + gzip.compress(b"}"), 200, None),  # two members, as gzip allows
            # Thousands of empty members held the event loop for seconds: a handful are allowed.
            ("gzip", gzip.compress(b"") * 4_000, 400, f"more than {MAX_GZIP_MEMBERS} members"),
            ("deflate", zlib.compress(b" " * 100_000), 200, None),
        ]
        async with httpx.AsyncClient(base_url=server.url) as http:
            for encoding, body, status, message in cases:
                answer = await http.post(
                    "/v1/traces",
                    content=body,
                    headers={"content-type": "application/json", "content-encoding": encoding},
                )
                assert answer.status_code == status, (encoding, answer.text)
                if message is not None:
                    assert message in answer.json()["error"]["message"]
    finally:
        await server.stop()


def test_decompressing_reads_every_member_across_feeds() -> None:
    # Members of 0 B to 300 KB: boundaries fall inside and at the edges of the decoder's feeds.
    texts = [bytes(range(256)) * (n // 256) + b"x" * (n % 256) for n in (0, 1, 70_000, 300_000, 65_536, 5)]
    body = b"".join(gzip.compress(text) for text in texts)
    assert decompress(body, "gzip", 10**7) == b"".join(texts) == gzip.decompress(body)
    assert decompress(zlib.compress(texts[3]), "deflate", 10**7) == texts[3]
    assert decompress(b"", "gzip", 10) == b""


def test_decompressing_is_bounded_by_size_time_and_members() -> None:
    body = gzip.compress(b"a" * 1000) * 3
    assert decompress(body, "gzip", 3000, max_members=3) == b"a" * 3000
    with pytest.raises(PayloadTooLargeError, match="over the limit of 2999 bytes"):
        decompress(body, "gzip", 2999)
    with pytest.raises(InvalidInputError, match="more than 2 members"):
        decompress(body, "gzip", 3000, max_members=2)
    with pytest.raises(PayloadTooLargeError, match="took over 0 s to decompress"):
        decompress(body, "gzip", 3000, seconds=0)


async def test_sequence_ids_in_attributes_are_whole_numbers_up_to_2_to_the_53(tmp_path: Path) -> None:
    async with start_store_server(tmp_path / "store.db") as store:
        attempted = await store.start_rollout(input={"q": 1})
        ids = {"agl.rollout_id": attempted.rollout_id, "agl.attempt_id": attempted.attempt.attempt_id}
        async with httpx.AsyncClient(base_url=store.url) as http:

            async def export(sequence_id: Any, span_number: int = 1) -> httpx.Response:
                body = export_request(ids, [proto_span(span_number, **{"agl.sequence_id": sequence_id})])
                headers = {"content-type": "application/x-protobuf"}
                return await http.post("/v1/traces", content=body.SerializeToString(), headers=headers)

            for bad in (float(2**63), 2.0**64, float("inf"), float("nan"), 3.5, 2**63 - 1, MAX_INTEGER + 1):
                answer = await export(bad)
                assert answer.status_code == 400, (bad, answer.text)
                assert "sequence id attribute" in answer.json()["error"]["message"]
            assert (await export(7.0)).status_code == 200  # a whole double, as JavaScript exporters send
            assert (await export(str(MAX_INTEGER), span_number=2)).status_code == 200
        spans = await store.query_spans(attempted.rollout_id)
        assert [span.sequence_id for span in spans] == [7, MAX_INTEGER]


async def test_the_opentelemetry_sdk_exporter_writes_into_the_store(tmp_path: Path) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource as SdkResource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    async with start_store_server(tmp_path / "store.db", key="sekret") as store:
        attempted = await store.start_rollout(input={"q": 1})
        provider = TracerProvider(
            resource=SdkResource.create(
                {"agl.rollout_id": attempted.rollout_id, "agl.attempt_id": attempted.attempt.attempt_id}
            )
        )
        exporter = OTLPSpanExporter(endpoint=store.url + "/v1/traces", headers={"Authorization": "Bearer sekret"})
        provider.add_span_processor(SimpleSpanProcessor(exporter))

        def record() -> None:
            with provider.get_tracer("test").start_as_current_span("agent.step") as span:
                span.set_attribute("agl.prompt_token_ids", [1, 2, 3])
            provider.shutdown()

        await asyncio.to_thread(record)
        (span,) = await store.query_spans(attempted.rollout_id)
        assert span.name == "agent.step"
        assert span.attributes["agl.prompt_token_ids"] == [1, 2, 3]
        assert span.sequence_id is not None and span.sequence_id >= 1
