"""The one interface every backend serves a call through.

A `Call` is an OpenAI chat or completions request plus where its answer goes; a `Backend`
serves it from one deployment (`PassthroughBackend` for OpenAI-compatible servers,
`LiteLLMBackend` for the rest) and answers in OpenAI's format through `call.send`. The
client APIs agl translates (Responses, Anthropic Messages) wrap `send`, never a backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.types import Receive, Send

from ..common.deployments import Deployment
from ..common.errors import ProxyError
from ..controls.pausing import CallHandle
from ..recording.call_record import CallRecord


@dataclass(frozen=True)
class RequestOptions:
    """What the proxy adds to every request it forwards."""

    logprobs: bool = False
    """Ask for the sampled tokens' logprobs when the client did not ask itself."""
    sampling_overrides: Mapping[str, Any] = field(default_factory=dict)
    """Request fields that replace the client's (e.g. a training temperature)."""


@dataclass(frozen=True, slots=True)
class Call:
    """One call as a backend serves it."""

    record: CallRecord
    """Filled in by the backend: deployment, request as sent, response, status, errors."""
    body: Mapping[str, Any]
    """The OpenAI request (`record.operation` says chat or completions)."""
    send: Send
    """Where the OpenAI-format answer goes (ASGI)."""
    t0: float
    """`time.perf_counter()` when the request arrived (for the time to first token)."""
    options: RequestOptions
    receive: Receive | None = None
    """With it, a stream stops (and the backend is released) when the client goes away."""
    row_tokens: int | None = None
    """The row budget of the call's rollout mode (`sampling.ROW_TOKENS`), which the token chain applies."""
    handle: CallHandle | None = None
    """The call's place at the pause gate: a weight update may ask it to stop generating and park."""
    current: Callable[[Deployment], Deployment] | None = None
    """A deployment as the model list has it now (a weight update gives its replicas a new version)."""


class RetryableBackendError(Exception):
    """The replica failed before anything was sent to the client; another may serve the call."""

    def __init__(self, error: ProxyError) -> None:
        super().__init__(error.message)
        self.error = error


class Backend(Protocol):
    """Serves calls from one deployment."""

    async def serve(self, call: Call) -> None:
        """Answer `call` through `call.send`, recording it in `call.record`.

        Raises `RetryableBackendError` when nothing reached the client yet and another
        replica may serve the call, a `ProxyError` when the call failed for good.
        """
        ...


def request_fields(body: Mapping[str, Any], defaults: Mapping[str, Any], options: RequestOptions) -> dict[str, Any]:
    """The client's request fields over a deployment's defaults, under the proxy's overrides.

    Every backend starts from this, then names the model its own way.
    """
    out = dict(body)
    for key, value in defaults.items():
        out.setdefault(key, value)
    out.update(options.sampling_overrides)
    return out
