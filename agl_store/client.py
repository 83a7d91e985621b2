"""`LightningStoreClient`: a LightningStore that talks to `agl store serve` over HTTP.

One aiohttp connection pool per client, one request path (`AiohttpTransport.fetch`: aiohttp's
C-parsed HTTP costs a third to a sixth of httpx's client CPU per small call,
`benchmarks/http_client_bench.py`). Network errors and 5xx answers are retried with capped,
jittered exponential backoff; 4xx answers are not. Error bodies (`{"error": {"code",
"message"}}`) become the same `agl_store.errors` classes the server raised, so code written
against an embedded store handles a remote one unchanged. Creates of rollouts carry an
idempotency key (the caller's, else a random one), so retrying one whose answer was lost
returns the rollout it made instead of making another.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeVar

import httpx
import orjson
from pydantic import TypeAdapter
from pydantic_core import PydanticSerializationError, to_json

from .base import UNSET, LightningStore
from .errors import ERRORS_BY_CODE, InvalidInputError, StoreClosedError, StoreError, StoreUnavailableError
from .http_paths import AGL_PREFIX
from .models import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    EnqueueRolloutRequest,
    NamedResources,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Span,
    StoreStatistics,
    TaskInput,
    Worker,
)
from .otel import span_from_otel
from .pages import Page
from .queries import AttemptQuery, ResourcesQuery, RolloutQuery, SpanQuery, WorkerQuery
from .span_wire import ENCODING_HEADER, PACKED, PACKED_MEDIA_TYPE, packed_batch, spans_from_page
from .web.http_transport import AiohttpTransport

logger = logging.getLogger("agl_store.client")

T = TypeVar("T")

MAX_CONNECTIONS = 100
"""Connections a client keeps to its server at most; more concurrent calls wait for one."""
WAIT_POLL_SECONDS = 300.0
"""Longest single long poll; matches the server's cap, longer waits poll again."""

_PACKED_SPANS = {ENCODING_HEADER: PACKED}
_ROLLOUTS: TypeAdapter[list[Rollout]] = TypeAdapter(list[Rollout])
_ATTEMPTED: TypeAdapter[list[AttemptedRollout]] = TypeAdapter(list[AttemptedRollout])


def _rollout(data: dict[str, Any]) -> Rollout:
    return AttemptedRollout.model_validate(data) if "attempt" in data else Rollout.model_validate(data)


def _create_key() -> str:
    return secrets.token_hex(16)


def _with_create_key(request: EnqueueRolloutRequest | Mapping[str, Any]) -> Any:
    """The request with an idempotency key: its own, else a new one."""
    if isinstance(request, EnqueueRolloutRequest):
        return request if request.idempotency_key else request.model_copy(update={"idempotency_key": _create_key()})
    return {**request, "idempotency_key": request.get("idempotency_key") or _create_key()}


class Answer(NamedTuple):
    """A store server's answer: what the client reads of it."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes


def _error_from(response: Answer, path: str) -> StoreError:
    """The store error an error response describes (its class chosen by `error.code`)."""
    try:
        error = orjson.loads(response.content)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        text = response.content[:500].decode("utf-8", "replace") or "(empty body)"
        return StoreError(f"HTTP {response.status_code} from {path}: {text}")
    cls = ERRORS_BY_CODE.get(code, StoreError)
    exc = cls(message)
    if cls is StoreError:
        exc.status_code = response.status_code
    return exc


class LightningStoreClient(LightningStore):
    """A LightningStore served by `agl store serve`.

    Open it with `await client.open()` or `async with LightningStoreClient(url) as store:`.
    `timeout` bounds each request (long polls get their wait added); `retries` is how many
    times a request is repeated after a network error or a 5xx before giving up with
    `StoreUnavailableError` (network) or the server's error (5xx). With `token_arrays`,
    `query_spans` leaves token id lists that travelled packed as `array('i')` instead of lists.
    """

    name = "LightningStoreClient"

    def __init__(
        self,
        url: str,
        key: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff_base: float = 0.1,
        backoff_max: float = 2.0,
        token_arrays: bool = False,
    ) -> None:
        self.url = url.rstrip("/")
        # Spans read back keep packed token ids as array('i') (packed_attributes.fill_packed): the trainer's reader.
        self._token_arrays = token_arrays
        self._key = key
        self._timeout = timeout
        self._retries = max(0, retries)
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._http: AiohttpTransport | None = None
        self._headers: dict[str, str] = {"authorization": f"Bearer {key}"} if key else {}
        self._closed = False
        self._packed_writes = True

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._http else "not opened"
        return f"LightningStoreClient({self.url!r}, {state})"

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into a runner subprocess: the settings travel, the connection pool does not.
        state = dict(self.__dict__)
        state.update(_http=None, _closed=False)
        return state

    # --- lifecycle ----------------------------------------------------------------------

    async def open(self) -> LightningStoreClient:
        """Create the connection pool. Idempotent; a closed client cannot be reopened."""
        if self._closed:
            raise StoreClosedError("this LightningStoreClient was closed; create a new one")
        if self._http is None:
            self._http = AiohttpTransport(max_connections=MAX_CONNECTIONS)
        return self

    async def close(self) -> None:
        self._closed = True
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()

    async def __aenter__(self) -> LightningStoreClient:
        return await self.open()

    # --- the request path ---------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        # Full jitter: spreads out the retries of many clients hitting one restarted server.
        return random.uniform(0, min(self._backoff_max, self._backoff_base * (2**attempt)))

    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = UNSET,
        content: bytes | None = None,
        params: Any = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        if self._http is None:
            await self.open()
        if body is not UNSET:
            try:
                content = to_json(body)
            except PydanticSerializationError as exc:  # not JSON, or nested past any reader: the server's 400
                raise InvalidInputError(f"request body is not JSON: {exc}") from None
            headers = {**(headers or {}), "content-type": "application/json"}
        last_network_error: Exception | None = None
        for attempt in range(self._retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff(attempt - 1))
            try:
                response = await self._request(method, path, content, params, headers, timeout)
            except httpx.TransportError as exc:
                last_network_error = exc
                logger.info("store request %s %s failed (%s); attempt %d", method, path, exc, attempt + 1)
                continue
            if response.status_code < 500:
                if response.status_code >= 400:
                    raise _error_from(response, path)
                return response
            last_network_error = None
            logger.info("store request %s %s answered %d; attempt %d", method, path, response.status_code, attempt + 1)
        if last_network_error is not None:
            raise StoreUnavailableError(
                f"store at {self.url} unreachable after {self._retries + 1} attempts: {last_network_error}"
            ) from last_network_error
        raise _error_from(response, path)

    async def _request(
        self,
        method: str,
        path: str,
        content: bytes | None,
        params: Any,
        headers: dict[str, str] | None,
        timeout: float | None,
    ) -> Answer:
        """One request, no retries."""
        assert self._http is not None
        status, answer_headers, data = await self._http.fetch(
            method,
            self.url + path,
            content=content,
            headers={**self._headers, **headers} if headers else self._headers,
            params=params,
            timeout=self._timeout if timeout is None else timeout,
        )
        return Answer(status, answer_headers, data)

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self._send(method, AGL_PREFIX + path, **kwargs)
        return orjson.loads(response.content)

    async def _page(self, path: str, body: dict[str, Any], parse: Callable[[Any], T]) -> Page[T]:
        data = await self._json("POST", path, body=body)
        return Page([parse(entry) for entry in data["items"]], total=data["total"])

    # --- the contract ---------------------------------------------------------------------

    async def statistics(self) -> StoreStatistics:
        return StoreStatistics.model_validate(await self._json("GET", "/statistics"))

    async def health(self) -> bool:
        """True when the server answers its health check."""
        try:
            await self._json("GET", "/health")
        except StoreError:
            return False
        return True

    async def start_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        worker_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> AttemptedRollout:
        body = {
            "input": input,
            "mode": mode,
            "resources_id": resources_id,
            "config": config,
            "metadata": metadata,
            "worker_id": worker_id,
            "idempotency_key": idempotency_key or _create_key(),
        }
        return AttemptedRollout.model_validate(await self._json("POST", "/rollouts", body=body))

    async def enqueue_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Rollout:
        one = {
            "input": input,
            "mode": mode,
            "resources_id": resources_id,
            "config": config,
            "metadata": metadata,
            "idempotency_key": idempotency_key or _create_key(),
        }
        data = await self._json("POST", "/queues/rollouts/enqueue", body={"rollouts": [one]})
        return Rollout.model_validate(data[0])

    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> Sequence[Rollout]:
        if not rollouts:
            return []
        keyed = [_with_create_key(request) for request in rollouts]
        data = await self._json("POST", "/queues/rollouts/enqueue", body={"rollouts": keyed})
        return _ROLLOUTS.validate_python(data)

    async def dequeue_rollout(
        self, worker_id: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> AttemptedRollout | None:
        rollouts = await self.dequeue_many_rollouts(limit=1, worker_id=worker_id, metadata=metadata)
        return rollouts[0] if rollouts else None

    async def dequeue_many_rollouts(
        self, *, limit: int = 1, worker_id: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> Sequence[AttemptedRollout]:
        body: dict[str, Any] = {"limit": limit, "worker_id": worker_id}
        if metadata is not None:  # a server without the filter then still answers a plain dequeue
            body["metadata"] = metadata
        data = await self._json("POST", "/queues/rollouts/dequeue", body=body)
        return _ATTEMPTED.validate_python(data)

    async def start_attempt(self, rollout_id: str, worker_id: str | None = None) -> AttemptedRollout:
        data = await self._json("POST", f"/rollouts/{rollout_id}/attempts", body={"worker_id": worker_id})
        return AttemptedRollout.model_validate(data)

    async def update_rollout(
        self,
        rollout_id: str,
        input: TaskInput = UNSET,
        mode: RolloutMode | None = UNSET,
        resources_id: str | None = UNSET,
        status: RolloutStatus = UNSET,
        config: RolloutConfig = UNSET,
        metadata: dict[str, Any] | None = UNSET,
    ) -> Rollout:
        fields = {
            "input": input,
            "mode": mode,
            "resources_id": resources_id,
            "status": status,
            "config": config,
            "metadata": metadata,
        }
        body = {name: value for name, value in fields.items() if value is not UNSET}
        return _rollout(await self._json("POST", f"/rollouts/{rollout_id}", body=body))

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"],
        status: AttemptStatus = UNSET,
        worker_id: str = UNSET,
        last_heartbeat_time: float = UNSET,
        metadata: dict[str, Any] = UNSET,
    ) -> Attempt:
        fields = {
            "status": status,
            "worker_id": worker_id,
            "last_heartbeat_time": last_heartbeat_time,
            "metadata": metadata,
        }
        body = {name: value for name, value in fields.items() if value is not UNSET}
        return Attempt.model_validate(
            await self._json("POST", f"/rollouts/{rollout_id}/attempts/{attempt_id}", body=body)
        )

    async def get_rollout_by_id(self, rollout_id: str) -> Rollout | None:
        data = await self._json("GET", f"/rollouts/{rollout_id}")
        return None if data is None else _rollout(data)

    async def get_latest_attempt(self, rollout_id: str) -> Attempt | None:
        data = await self._json("GET", f"/rollouts/{rollout_id}/attempts/latest")
        return None if data is None else Attempt.model_validate(data)

    async def find_rollouts(self, query: RolloutQuery) -> Page[Rollout]:
        return await self._page("/rollouts/search", query.request_fields(), _rollout)

    async def find_attempts(self, rollout_id: str, query: AttemptQuery) -> Page[Attempt]:
        path = f"/rollouts/{rollout_id}/attempts/search"
        return await self._page(path, query.request_fields(), Attempt.model_validate)

    async def wait_for_rollouts(self, *, rollout_ids: list[str], timeout: float | None = None) -> list[Rollout]:
        """Long-polls the server; waits longer than its cap are several polls."""
        wanted = set(rollout_ids)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = WAIT_POLL_SECONDS if deadline is None else max(0.0, deadline - time.monotonic())
            poll = min(remaining, WAIT_POLL_SECONDS)
            data = await self._json(
                "POST",
                "/waits/rollouts",
                body={"rollout_ids": rollout_ids, "timeout": poll},
                timeout=poll + self._timeout,
            )
            finished = [_rollout(item) for item in data]
            unfinished = wanted - {r.rollout_id for r in finished}
            if not unfinished or (deadline is not None and time.monotonic() >= deadline):
                return finished
            # The poll also ends early when only unknown ids are left, which are not waited for.
            if not await self.query_rollouts(rollout_id_in=list(unfinished), limit=1):
                return finished

    # --- spans ----------------------------------------------------------------------------

    async def add_span(self, span: Span) -> Span | None:
        stored = await self.add_many_spans([span])
        return stored[0] if stored else None

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        """All spans in one request and one transaction on the server.

        The server answers with positions and sequence ids, not the spans, so the stored
        spans are rebuilt here from the ones sent.
        """
        if not spans:
            return []
        spans = [span if isinstance(span, Span) else Span.model_validate(span) for span in spans]
        response = None
        if self._packed_writes:
            # Token ids packed here, not parsed by the server (see agl_store.span_wire).
            try:
                response = await self._send(
                    "POST",
                    AGL_PREFIX + "/spans/batch/packed",
                    content=packed_batch(spans),
                    headers={"content-type": PACKED_MEDIA_TYPE},
                )
            except StoreError as exc:
                if not (type(exc) is StoreError and getattr(exc, "status_code", None) == 404):
                    raise
                self._packed_writes = False  # a server without the route: plain JSON from now on
        if response is None:
            response = await self._send("POST", AGL_PREFIX + "/spans/batch", body=spans)
        stored = orjson.loads(response.content)["stored"]
        # `attempt_id` comes back only for spans sent as "latest": the attempt they were stored under.
        return [
            spans[item["index"]].model_copy(update={k: item[k] for k in ("sequence_id", "attempt_id") if k in item})
            for item in stored
        ]

    async def add_otel_span(
        self,
        rollout_id: str,
        attempt_id: str,
        readable_span: Any,
        sequence_id: int | None = None,
    ) -> Span | None:
        return await self.add_span(span_from_otel(readable_span, rollout_id, attempt_id, sequence_id))

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        data = await self._json("POST", "/spans/next", body={"rollout_id": rollout_id, "attempt_id": attempt_id})
        return int(data["sequence_id"])

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[tuple[str, str]]) -> Sequence[int]:
        if not rollout_attempt_ids:
            return []
        body = {"rollout_attempt_ids": [list(pair) for pair in rollout_attempt_ids]}
        return list((await self._json("POST", "/spans/next/many", body=body))["sequence_ids"])

    async def find_spans(self, query: SpanQuery) -> Page[Span]:
        body = query.request_fields()
        # Token ids travel packed (see agl_store.span_wire) when the server supports it.
        response = await self._send("POST", AGL_PREFIX + "/spans/search", body=body, headers=_PACKED_SPANS)
        packed = response.headers.get(ENCODING_HEADER) == PACKED
        spans, total = spans_from_page(response.content, packed, arrays=self._token_arrays)
        return Page(spans, total=total)

    # --- resources ------------------------------------------------------------------------

    async def add_resources(self, resources: NamedResources) -> ResourcesUpdate:
        # Models or plain dicts: the server validates either.
        return ResourcesUpdate.model_validate(await self._json("POST", "/resources", body=resources))

    async def update_resources(self, resources_id: str, resources: NamedResources) -> ResourcesUpdate:
        data = await self._json("POST", f"/resources/{resources_id}", body=resources)
        return ResourcesUpdate.model_validate(data)

    async def get_resources_by_id(self, resources_id: str) -> ResourcesUpdate | None:
        data = await self._json("GET", f"/resources/{resources_id}")
        return None if data is None else ResourcesUpdate.model_validate(data)

    async def get_latest_resources(self) -> ResourcesUpdate | None:
        data = await self._json("GET", "/resources/latest")
        return None if data is None else ResourcesUpdate.model_validate(data)

    async def find_resources(self, query: ResourcesQuery) -> Page[ResourcesUpdate]:
        # A query string has no null: a filter left at None is left out.
        params = {
            name: value
            for name, value in query.request_fields().items()
            if value is not None or ResourcesQuery.model_fields[name].default is not None
        }
        data = await self._json("GET", "/resources", params=params)
        items = [ResourcesUpdate.model_validate(item) for item in data["items"]]
        return Page(items, total=data["total"])

    # --- workers --------------------------------------------------------------------------

    async def update_worker(self, worker_id: str, heartbeat_stats: dict[str, Any] = UNSET) -> Worker:
        body = {} if heartbeat_stats is UNSET else {"heartbeat_stats": heartbeat_stats}
        return Worker.model_validate(await self._json("POST", f"/workers/{worker_id}", body=body))

    async def find_workers(self, query: WorkerQuery) -> Page[Worker]:
        return await self._page("/workers/search", query.request_fields(), Worker.model_validate)

    async def get_worker_by_id(self, worker_id: str) -> Worker | None:
        data = await self._json("GET", f"/workers/{worker_id}")
        return None if data is None else Worker.model_validate(data)

    # --- retention ------------------------------------------------------------------------

    async def delete_rollouts(self, rollout_ids: Sequence[str]) -> int:
        if not rollout_ids:
            return 0
        return int((await self._json("POST", "/rollouts/delete", body={"rollout_ids": list(rollout_ids)}))["deleted"])

    async def expire_rollouts(self, older_than_seconds: float) -> int:
        data = await self._json("POST", "/rollouts/expire", body={"older_than_seconds": older_than_seconds})
        return int(data["deleted"])
