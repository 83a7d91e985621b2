"""agl's own pass-through to OpenAI-compatible backends (vLLM).

The body goes to the backend with `return_token_ids` (and logprobs when configured)
injected; the backend's bytes go back to the client unchanged, streamed chunks as they
arrive, while a copy is read into the call's record for its span. Failures before the
first byte reaches the client raise `RetryableBackendError` so another replica can take
the call; after that they end the stream with an SSE error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import orjson
from starlette.types import Receive, Send

from ..common.deployments import Deployment
from ..common.errors import BackendFailedError, BackendTimeoutError, ProxyError, short_text
from ..recording.assembly import StreamAssembler
from ..recording.call_record import CallRecord
from .base import Call, RequestOptions, RetryableBackendError, request_fields

CONNECT_TIMEOUT_S = 10.0
_PATHS = {"chat": "/chat/completions", "text_completion": "/completions"}


def backend_body(
    body: Mapping[str, Any], deployment: Deployment, operation: str, options: RequestOptions
) -> dict[str, Any]:
    """The request body as the backend gets it."""
    out = request_fields(body, deployment.request_defaults, options)
    out["model"] = deployment.model
    if deployment.is_vllm:
        out["return_token_ids"] = True
    if options.logprobs and out.get("logprobs") in (None, False):
        # Chat takes a flag, completions the number of alternatives per token (0: the sampled one).
        out["logprobs"] = True if operation == "chat" else 0
    return out


def backend_headers(deployment: Deployment, rollout_id: str, attempt_id: str) -> dict[str, str]:
    headers = {**deployment.headers, "content-type": "application/json"}
    if rollout_id:
        headers["x-rollout-id"] = rollout_id
    if attempt_id:
        headers["x-attempt-id"] = attempt_id
    if deployment.api_key:
        headers["authorization"] = f"Bearer {deployment.api_key}"
    elif deployment.basic_auth:
        headers["authorization"] = deployment.basic_auth
    return headers


def json_object_or_none(data: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def error_message(response: httpx.Response, data: bytes, parsed: dict[str, Any] | None) -> str:
    """What the backend said went wrong, short: the message of an OpenAI- or FastAPI-shaped
    JSON error (`parsed`: the body as a JSON object, or None), else only the type and size of
    the body. Whatever else a backend answers (an internal service's page, if a deployment
    points there) is not repeated."""
    if parsed is not None:
        error = parsed.get("error", parsed)
        for message in (error.get("message") if isinstance(error, dict) else error, parsed.get("detail")):
            if isinstance(message, str) and message:
                return short_text(message)
    return _body_summary(response, data)


def _body_summary(response: httpx.Response, data: bytes) -> str:
    content_type = short_text(response.headers.get("content-type", "no content type"), 60)
    return f"a {content_type} body of {len(data)} bytes"


def _response_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", response.headers.get("content-type", "application/json").encode("latin-1"))]


async def relay_chunk(data: bytes, send: Send, assembler: StreamAssembler, record: CallRecord, t0: float) -> None:
    """Send one chunk of a stream to the client and read it into the call's record (and its TTFT)."""
    await send({"type": "http.response.body", "body": data, "more_body": True})
    assembler.feed(data)
    if record.ttft_s is None and assembler.first_token_seen:
        record.ttft_s = time.perf_counter() - t0


class PassthroughBackend:
    """Serves calls from an OpenAI-compatible deployment with agl's own HTTP client."""

    __slots__ = ("client", "deployment", "url")

    def __init__(self, client: httpx.AsyncClient, deployment: Deployment, operation: str) -> None:
        self.client = client
        self.deployment = deployment
        self.url = f"{deployment.api_base}{_PATHS[operation]}"

    async def serve(self, call: Call) -> None:
        deployment, client, record = self.deployment, self.client, call.record
        request_body = backend_body(call.body, deployment, record.operation, call.options)
        record.deployment = deployment
        record.request = request_body
        timeout = httpx.Timeout(deployment.timeout_s, connect=min(CONNECT_TIMEOUT_S, deployment.timeout_s))
        request = client.build_request(
            "POST",
            self.url,
            content=orjson.dumps(request_body),
            headers=backend_headers(deployment, record.rollout_id, record.attempt_id),
            timeout=timeout,
        )
        with backend_failures(deployment, "did not answer", "failed"):
            try:
                response = await client.send(request, stream=True)
            except httpx.RemoteProtocolError:
                # A kept-alive connection the server had just closed: the request never ran.
                response = await client.send(request, stream=True)
        try:
            is_stream = response.headers.get("content-type", "").startswith("text/event-stream")
            if is_stream and response.status_code < 300:
                await _relay_stream(response, deployment, record, call.send, call.t0, call.receive)
            else:
                await _relay_body(response, deployment, record, call.send)
        finally:
            await response.aclose()


@contextlib.contextmanager
def backend_failures(deployment: Deployment, timed_out: str, failed: str) -> Iterator[None]:
    """Backend I/O errors as the proxy's: a timeout → `BackendTimeoutError` ("backend X
    `timed_out` within N s"); a refused or broken connection → a retryable `BackendFailedError`."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise BackendTimeoutError(f"backend {deployment.label} {timed_out} within {deployment.timeout_s:g} s") from exc
    except httpx.ConnectError as exc:
        raise RetryableBackendError(
            BackendFailedError(f"backend {deployment.label} refused the connection: {exc}")
        ) from exc
    except httpx.TransportError as exc:
        raise RetryableBackendError(
            BackendFailedError(f"backend {deployment.label} {failed}: {type(exc).__name__}: {exc}")
        ) from exc


async def _relay_body(response: httpx.Response, deployment: Deployment, record: CallRecord, send: Send) -> None:
    label = deployment.label
    with backend_failures(deployment, "did not finish its answer", "dropped the connection"):
        data = await response.aread()
    status = response.status_code
    parsed = json_object_or_none(data)
    if status >= 500:
        raise RetryableBackendError(
            BackendFailedError(f"backend {label} answered HTTP {status}: {error_message(response, data, parsed)}")
        )
    if status < 300:
        if parsed is None or "choices" not in parsed:
            raise RetryableBackendError(
                BackendFailedError(
                    f"backend {label} answered HTTP {status} with {_body_summary(response, data)} "
                    "that is not an OpenAI response"
                )
            )
        record.response = parsed
    elif status >= 400 and parsed is not None:
        # The backend's own verdict on the request (e.g. too long a prompt): the client sees it as is.
        message = f"backend {label} answered HTTP {status}: {error_message(response, data, parsed)}"
        record.fail("backend_rejected", message, status)
    else:
        # A redirect, or a 4xx that is not a JSON error: not an OpenAI-compatible server's answer.
        raise RetryableBackendError(
            BackendFailedError(
                f"backend {label} answered HTTP {status} with {_body_summary(response, data)}, not an OpenAI error"
            )
        )
    record.status_code = status
    await send({"type": "http.response.start", "status": status, "headers": _response_headers(response)})
    await send({"type": "http.response.body", "body": data})


async def _relay_stream(
    response: httpx.Response,
    deployment: Deployment,
    record: CallRecord,
    send: Send,
    t0: float,
    receive: Receive | None,
) -> None:
    assembler = StreamAssembler(record.operation)
    record.status_code = response.status_code
    label = deployment.label
    chunks = response.aiter_raw()
    # Read the first chunk before answering, so a replica that fails at once can still be replaced.
    with backend_failures(deployment, "sent no data", "dropped the stream"):
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = b""
    await send({"type": "http.response.start", "status": response.status_code, "headers": _response_headers(response)})
    error: ProxyError | None = None
    data = first
    # The request body is read, so the next ASGI message is the client's disconnect.
    watcher = asyncio.ensure_future(receive()) if receive is not None else None
    try:
        while True:
            if watcher is not None and watcher.done():
                record.fail("client_disconnected", f"the client went away mid-stream; stopped reading {label}", 499)
                break
            if data:
                await relay_chunk(data, send, assembler, record, t0)
            try:
                data = await chunks.__anext__()
            except StopAsyncIteration:
                break
    except httpx.TimeoutException:
        error = BackendTimeoutError(f"backend {label} stalled mid-stream for more than {deployment.timeout_s:g} s")
    except httpx.TransportError as exc:
        error = BackendFailedError(f"backend {label} dropped the stream: {type(exc).__name__}: {exc}")
    finally:
        if watcher is not None:
            watcher.cancel()
    if record.error is not None:
        pass  # the client went away: that is the call's outcome
    elif error is not None:
        record.fail_with(error)
        await send({"type": "http.response.body", "body": error.sse_event(), "more_body": True})
    elif assembler.error is not None:
        message = assembler.error.get("message") if isinstance(assembler.error, dict) else assembler.error
        record.fail(
            "backend_stream_error",
            f"backend {label} reported an error mid-stream: {short_text(str(message))}",
            record.status_code,
        )
    elif assembler.garbage is not None:
        record.fail("backend_garbage", f"backend {label} streamed data that is not JSON", 502)
    record.response = assembler.result()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
