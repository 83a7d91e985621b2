"""Deployments that are not OpenAI-compatible (Anthropic, Bedrock, ...) go through LiteLLM.

LiteLLM is imported only when such a deployment is configured (at start, or in a thread on
the first call after `update_model_list` adds one): the import costs seconds of CPU that a
proxy serving only vLLM never needs to pay. Token ids are whatever the provider gives
(usually none); the span still records request, response, usage and timing.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import orjson

from ..common.deployments import Deployment
from ..common.errors import BackendFailedError, BackendTimeoutError, short_text
from ..recording.assembly import StreamAssembler
from .base import Call, RetryableBackendError, request_fields
from .forwarding import relay_chunk


def import_litellm() -> Any:
    """The litellm module (imported on first use; set up to stay offline)."""
    # Without this LiteLLM fetches its cost map from the internet at import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    return litellm


_JSON = (b"content-type", b"application/json")


def _dump(obj: Any) -> dict[str, Any]:
    return obj.model_dump() if hasattr(obj, "model_dump") else dict(obj)


class LiteLLMBackend:
    """Serves calls through `litellm.acompletion` / `atext_completion`."""

    __slots__ = ("deployment",)

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    async def serve(self, call: Call) -> None:
        deployment, record, send = self.deployment, call.record, call.send
        # In a thread: the first import takes seconds, which must not stall the other calls.
        litellm = await asyncio.to_thread(import_litellm)
        request = request_fields(call.body, deployment.request_defaults, call.options)
        request["model"] = deployment.litellm_params["model"]
        record.deployment = deployment
        # The span gets the request, never the connection settings and credentials added below.
        record.request = request
        kwargs = {**request, **deployment.litellm_kwargs, "timeout": deployment.timeout_s, "num_retries": 0}
        complete = litellm.acompletion if record.operation == "chat" else litellm.atext_completion
        label = deployment.label
        try:
            result = await complete(**kwargs)
        except Exception as exc:  # LiteLLM's exceptions carry the provider's status
            status = getattr(exc, "status_code", None)
            message = f"backend {label} (via LiteLLM) failed: {short_text(str(getattr(exc, 'message', None) or exc))}"
            if isinstance(exc, litellm.exceptions.Timeout):
                raise BackendTimeoutError(message) from exc
            if isinstance(exc, litellm.exceptions.APIConnectionError) or not isinstance(status, int) or status >= 500:
                raise RetryableBackendError(BackendFailedError(message)) from exc
            record.fail("backend_rejected", message, status)
            error = {"error": {"message": message, "type": type(exc).__name__, "code": status}}
            await send({"type": "http.response.start", "status": status, "headers": [_JSON]})
            await send({"type": "http.response.body", "body": orjson.dumps(error)})
            return
        record.status_code = 200
        if not record.stream:
            record.response = _dump(result)
            await send({"type": "http.response.start", "status": 200, "headers": [_JSON]})
            await send({"type": "http.response.body", "body": orjson.dumps(record.response)})
            return
        assembler = StreamAssembler(record.operation)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        try:
            async for chunk in result:
                await relay_chunk(b"data: " + orjson.dumps(_dump(chunk)) + b"\n\n", send, assembler, record, call.t0)
        except Exception as exc:  # mid-stream: tell the client in the stream
            failure = BackendFailedError(f"backend {label} (via LiteLLM) failed mid-stream: {short_text(str(exc))}")
            record.fail_with(failure)
            await send({"type": "http.response.body", "body": failure.sse_event(), "more_body": True})
        else:
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        record.response = assembler.result()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
