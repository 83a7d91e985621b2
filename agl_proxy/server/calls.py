"""The endpoint of `/v1/chat/completions` and `/v1/completions` (and, translated to chat,
`/v1/responses` and `/v1/messages`), as a pure ASGI app.

Per call: wait while the span backlog is full (refuse if it stays full), read the body,
wait while paused (refuse past the hold bound), attribute it to a rollout (path or
headers), resolve the model, ask the store for the call's sequence number in the
background, enforce the rollout mode's sampling, pick a replica (retrying on another
when one fails before answering), relay the answer (checking its token ids), and hand
the call's record to the span exporter.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from ..backends.base import Backend, Call, RetryableBackendError
from ..backends.forwarding import PassthroughBackend
from ..backends.litellm_path import LiteLLMBackend
from ..chain.backend import TokenChainBackend
from ..common.deployments import Deployment
from ..common.errors import (
    BadRequestError,
    CancelledForUpdateError,
    ModelNotFoundError,
    NoBackendError,
    PausedError,
    ProxyError,
    SpanBacklogError,
    send_error,
)
from ..controls.pausing import CallHandle
from ..controls.sampling import ROW_TOKENS, SAMPLING_FIELDS
from ..recording.call_record import CallRecord
from ..translate.base import ClientApi, TooDeepError, TranslatingSend, check_depth
from .answering import ClientAnswer
from .state import ProxyState

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_ID_CHARS = 256
# Ids travel on to the backend as header values: printable ASCII only.
_ID = re.compile(r"[\x20-\x7e]*")


def attribution(scope: Scope) -> tuple[str, str]:
    """(rollout_id, attempt_id) from the per-rollout path, else the `x-rollout-id` / `x-attempt-id` headers.

    BadRequestError names the id that is not printable ASCII of at most 256 characters.
    """
    params = scope.get("path_params") or {}
    rollout_id = _checked_id(params.get("rollout_id") or "", "rollout id (path)")
    attempt_id = _checked_id(params.get("attempt_id") or "", "attempt id (path)")
    if not rollout_id:
        for name, value in scope["headers"]:
            if name == b"x-rollout-id":
                rollout_id = _checked_id(value.decode("latin-1"), "x-rollout-id header")
            elif name == b"x-attempt-id":
                attempt_id = _checked_id(value.decode("latin-1"), "x-attempt-id header")
    return rollout_id, attempt_id


def _checked_id(value: str, field: str) -> str:
    if len(value) > MAX_ID_CHARS or not _ID.fullmatch(value):
        raise BadRequestError(
            f"the {field} must be printable ASCII of at most {MAX_ID_CHARS} characters "
            f"(no control characters, no CR/LF): {value[:100]!r}"
        )
    return value


async def read_body(receive: Receive) -> bytes:
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadRequestError(f"the request body is larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def json_object(raw: bytes) -> dict[str, Any]:
    """`raw` parsed as a JSON object; BadRequestError when it is not valid JSON or not an object."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    return body


class LLMCallEndpoint:
    """Serves one OpenAI operation (`chat` or `text_completion`) of a proxy.

    With `api`, the client speaks that API (Responses, Anthropic Messages): its request is
    translated to a chat request and every answer, error or event back to its own format.
    """

    def __init__(self, state: ProxyState, operation: str, api: ClientApi | None = None) -> None:
        self.state = state
        self.operation = operation
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.api is not None:
            send = TranslatingSend(send, self.api)
        state = self.state
        # Backpressure: a call is admitted only while the store keeps up with the spans of
        # earlier ones, so no answered call's span ever has to be given up.
        exporter = state.exporter
        if not await exporter.wait_for_room():
            await send_error(send, SpanBacklogError.for_backlog(exporter.buffered, exporter.backpressure_wait_s))
            return
        try:
            raw = await read_body(receive)
        except BadRequestError as exc:
            await send_error(send, exc)
            return
        gate = state.gate
        try:
            # While paused the call waits here; the body is read, so `receive` returns when the client leaves.
            handle = await gate.enter(receive)
        except PausedError as exc:
            await send_error(send, exc)
            return
        if handle is None:
            return  # the client went away while held: nobody to answer
        try:
            await self._serve(scope, raw, receive, send, handle)
        finally:
            gate.exit(handle)

    async def _serve(self, scope: Scope, raw: bytes, receive: Receive, send: Send, handle: CallHandle) -> None:
        state = self.state
        t0 = time.perf_counter()
        start_time = time.time()
        too_deep: TooDeepError | None = None
        try:
            rollout_id, attempt_id = attribution(scope)
            body = request = json_object(raw)
            try:
                if isinstance(send, TranslatingSend):
                    send.request = request
                    body = send.api.chat_request(request)
                    send.tools_left_out = send.api.tools_left_out(request)
                else:
                    # As the translated APIs do: a body nested deeper than a span holds is refused (the
                    # store could not keep it, and orjson writes 254 levels at most).
                    check_depth(body)
            except TooDeepError as exc:
                # Refused, but a call of its rollout all the same: its span keeps the body without that field.
                too_deep = exc
                body = request = exc.kept
                if isinstance(send, TranslatingSend):
                    send.request = request
        except BadRequestError as exc:
            await send_error(send, exc)
            return
        model = body.get("model")
        record = CallRecord(
            operation=self.operation,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            requested_model=model if isinstance(model, str) else None,
            stream=bool(body.get("stream")),
            start_time=start_time,
            request=request,
            api=self.api.name if self.api is not None else None,
        )
        if isinstance(send, TranslatingSend):
            send.record = record
            record.tools_left_out = send.tools_left_out
        replicas: Sequence[Deployment] = []
        no_backend: NoBackendError | None = None
        try:
            replicas = state.registry.resolve(record.requested_model)
        except ModelNotFoundError as exc:
            # A typo in the model name is the client's mistake, not a call: no span.
            state.metrics.observe_error(record.requested_model or "", "", exc.code)
            await send_error(send, exc)
            return
        except NoBackendError as exc:
            no_backend = exc
        answer = ClientAnswer(send, record, state.settings.require_token_ids)
        sequence = None
        try:
            if rollout_id and not attempt_id:
                record.attempt_id = attempt_id = await state.latest_attempt_id(rollout_id)
            sequence = answer.number = state.exporter.reserve_sequence(rollout_id, attempt_id)
            if too_deep is not None:
                raise too_deep
            if no_backend is not None:
                raise no_backend
            await self._dispatch(replicas, record, body, receive, answer, t0, handle)
        except ProxyError as exc:
            record.fail_with(exc)
            await answer.fail(exc)
        except asyncio.CancelledError:
            if not handle.cancelled:
                raise
            # The gate cut the call for a weight update: answer it and record it, then end normally.
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            error = CancelledForUpdateError.for_pause(state.gate.reason)
            record.fail_with(error)
            await answer.fail(error)
        finally:
            if request is not body:
                record.client_request = request  # the span keeps the client's request, in its own API
            record.latency_s = time.perf_counter() - t0
            if record.ttft_s is None and record.error is None:
                record.ttft_s = record.latency_s
            backend = record.deployment.label if record.deployment else ""
            state.metrics.observe_call(
                record.requested_model or "",
                backend,
                record.status_code,
                record.latency_s,
                record.ttft_s if record.stream else None,
            )
            if record.error is not None:
                state.metrics.observe_error(record.requested_model or "", backend, record.error["type"])
            checked = record.check_token_ids()
            if checked is not None:
                state.metrics.observe_token_ids(backend, checked[0])
            state.exporter.submit(record, sequence)

    async def _dispatch(
        self,
        replicas: Sequence[Deployment],
        record: CallRecord,
        body: dict[str, Any],
        receive: Receive,
        send: Send,
        t0: float,
        handle: CallHandle,
    ) -> None:
        state = self.state
        enforcement = await state.sampling.for_rollout(record.rollout_id)
        row_tokens = enforcement.row_tokens if enforcement is not None else None
        if enforcement is not None:
            record.sampling_mode = enforcement.mode
        if row_tokens is not None:
            # A backend that renders itself: the call counts as a row's first (the token chain says more).
            record.row = {ROW_TOKENS: row_tokens}
        tried: set[str] = set()
        last_error: ProxyError | None = None
        while True:
            deployment = state.balancer.choose(replicas, record.rollout_id or None, exclude=tried)
            if deployment is None:
                assert last_error is not None
                if len(tried) > 1:
                    raise type(last_error)(
                        f"{last_error.message} (tried {len(tried)} replicas of {record.requested_model!r})",
                        headers=last_error.headers,
                    )
                raise last_error
            tried.add(deployment.key)
            sent = body
            if enforcement is not None:
                # The deployment's own defaults count as set: a cap applies to them too.
                defaults = {k: v for k, v in deployment.request_defaults.items() if k in SAMPLING_FIELDS}
                sent = enforcement.apply({**defaults, **body})
            state.balancer.acquire(deployment)
            try:
                call = Call(
                    record, sent, send, t0, state.options, receive, row_tokens, handle, state.current_deployment
                )
                await self._backend(deployment).serve(call)
                if record.status_code < 500:
                    state.balancer.mark_ok(deployment)
                return
            except RetryableBackendError as exc:
                state.balancer.mark_failed(deployment)
                last_error = exc.error
                logger.warning(
                    "agl_proxy: %s; replica cooling down for %.0f s", exc.error.message, state.balancer.cooldown_s
                )
            finally:
                state.balancer.release(deployment)

    def _backend(self, deployment: Deployment) -> Backend:
        if not deployment.passthrough:
            return LiteLLMBackend(deployment)
        state = self.state
        client = state.client
        assert client is not None, "the proxy's app was not started"
        if (
            self.operation == "chat"
            and deployment.is_vllm
            and deployment.token_chain
            and state.settings.token_chain != "off"
        ):
            return TokenChainBackend(client, state.engine_http, deployment, state.chains, state.engines, state.heads)
        return PassthroughBackend(client, deployment, self.operation)
