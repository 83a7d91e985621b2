"""Anthropic's `/v1/messages/count_tokens`: the prompt's length as the backend's chat template makes it.

The messages are translated as for `/v1/messages` and tokenized by the vLLM deployment's own
`/tokenize` route, so the count is the prompt length a call would have. Not a call: no span.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from starlette.types import Receive, Scope, Send

from ..backends.forwarding import CONNECT_TIMEOUT_S, backend_headers
from ..common.errors import BackendFailedError, BadRequestError, ProxyError
from ..translate.base import check_depth, expect
from ..translate.messages import MESSAGES, chat_messages
from ..translate.messages_tools import chat_tools
from .calls import json_object, read_body
from .state import ProxyState


class CountTokensEndpoint:
    def __init__(self, state: ProxyState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            status, body = 200, {"input_tokens": await self._count(await read_body(receive))}
        except ProxyError as exc:
            status, body = exc.status_code, MESSAGES.error(exc.status_code, exc.to_dict()["error"])
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        await send({"type": "http.response.body", "body": orjson.dumps(body)})

    async def _count(self, raw: bytes) -> int:
        body = json_object(raw)
        check_depth(body)
        model = expect(body.get("model"), str, "model", "a string")
        request: dict[str, Any] = {"messages": chat_messages(body)}
        tools = chat_tools(body.get("tools")).functions
        if tools:
            request["tools"] = tools
        replicas = self.state.registry.resolve(model)
        deployment = next((d for d in replicas if d.is_vllm), None)
        if deployment is None:
            raise BadRequestError(f"model: counting tokens needs a vLLM deployment, and {model!r:.80} has none")
        request["model"] = deployment.model
        url = (deployment.api_base or "").removesuffix("/").removesuffix("/v1") + "/tokenize"
        client = self.state.client
        assert client is not None, "the proxy's app was not started"
        timeout = httpx.Timeout(deployment.timeout_s, connect=min(CONNECT_TIMEOUT_S, deployment.timeout_s))
        try:
            response = await client.post(
                url,
                content=orjson.dumps(request),
                headers=backend_headers(deployment, "", ""),
                timeout=timeout,
            )
            answer = orjson.loads(response.content)
        except (httpx.HTTPError, orjson.JSONDecodeError) as exc:
            raise BackendFailedError(f"backend {deployment.label} could not count tokens: {exc!r:.200}") from exc
        if response.status_code >= 400 or not isinstance(answer, dict) or not isinstance(answer.get("count"), int):
            raise BackendFailedError(
                f"backend {deployment.label} answered /tokenize with HTTP {response.status_code} and no count"
            )
        count: int = answer["count"]
        return count
