"""vLLM's token-in endpoints (served with `--enable-scale-out`): found once per deployment,
called with JSON.

`/v1/chat/completions/render` turns a chat request into prompt ids and sampling params,
`/inference/v1/generate` samples from ids, `/v1/chat/completions/derender` turns generated
ids into the chat answer through the server's own tool and reasoning parsers. `EngineProbes`
checks a deployment once (its OpenAPI paths, its context length, and where its chat
template closes an assistant turn) and keeps the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from ..backends.base import RetryableBackendError
from ..backends.forwarding import backend_failures, backend_headers, error_message, json_object_or_none
from ..common.deployments import Deployment
from ..common.errors import BackendFailedError
from .engine_http import EngineHttp

logger = logging.getLogger(__name__)

RENDER = "/v1/chat/completions/render"
GENERATE = "/inference/v1/generate"
DERENDER = "/v1/chat/completions/derender"
DETOKENIZE = "/detokenize"
_PROBE_TIMEOUT_S = 10.0


class EngineRejected(Exception):
    """The engine answered the request with a 4xx JSON error: the client's answer as it is."""

    def __init__(self, status: int, data: bytes, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.data = data
        self.message = message


@dataclass(frozen=True, slots=True)
class Engine:
    """A vLLM deployment that takes token ids."""

    root: str
    """The server's URL without `/v1`."""
    max_model_len: int | None
    close: tuple[int, ...]
    """The ids the chat template puts after an assistant message's content (Qwen: `<|im_end|>`, `\\n`);
    empty when the probe could not show them (then no call is bridged)."""
    close_text: str = ""
    """`close` as text (`/detokenize`), stripped; "" when unknown."""


def server_root(api_base: str) -> str:
    return api_base[: -len("/v1")] if api_base.endswith("/v1") else api_base


async def post_json(
    transport: EngineHttp, deployment: Deployment, path: str, body: Mapping[str, Any], headers: Mapping[str, str]
) -> dict[str, Any]:
    """POST `body` to the engine's `path`; its JSON object answer.

    Raises `RetryableBackendError` when the engine failed (unreachable, 5xx, not JSON),
    `EngineRejected` when it refused the request (4xx with a JSON error).
    """
    url = server_root(deployment.api_base or "") + path
    with backend_failures(deployment, "did not answer", "failed"):
        status, answer_headers, data = await transport.fetch(
            "POST", url, content=orjson.dumps(body), headers=headers, timeout=deployment.timeout_s
        )
    return engine_answer(deployment, path, status, answer_headers, data)


def engine_answer(
    deployment: Deployment, path: str, status: int, answer_headers: Mapping[str, str], data: bytes
) -> dict[str, Any]:
    """The engine's JSON object answer to a request to `path`; raises as `post_json` says."""
    parsed = json_object_or_none(data)
    if status < 300 and parsed is not None:
        return parsed
    response = httpx.Response(status, headers=dict(answer_headers))
    if 400 <= status < 500 and parsed is not None:
        message = f"backend {deployment.label} answered HTTP {status}: {error_message(response, data, parsed)}"
        raise EngineRejected(status, data, message)
    raise RetryableBackendError(
        BackendFailedError(
            f"backend {deployment.label} answered {path} with HTTP {status}: {error_message(response, data, parsed)}"
        )
    )


async def detokenize(
    transport: EngineHttp, deployment: Deployment, headers: Mapping[str, str], ids: list[int]
) -> str | None:
    """The engine's text of `ids` (`/detokenize`); None where it refuses the request (4xx) or
    answers no text. Raises as `post_json` does when the engine fails."""
    body = {"model": deployment.model, "tokens": ids}
    try:
        text = (await post_json(transport, deployment, DETOKENIZE, body, headers)).get("prompt")
    except EngineRejected:
        return None
    return text if isinstance(text, str) else None


def ends_on_stop_token(token_ids: Sequence[int], finish_reason: str | None, sampling_params: Mapping[str, Any]) -> bool:
    """Whether the engine stopped this answer on its last id (the end-of-sequence or a stop token
    id), whose text vLLM's detokenizer then leaves out of the answer its chat endpoint gives
    (`vllm/v1/engine/detokenizer.py`, `BaseIncrementalDetokenizer.update`: `stop_terminated`),
    unless the request asks for it (`include_stop_str_in_output`).

    The derender decodes every id it is given (its parser path keeping special tokens), so it is
    given the answer without that id. A stop string ends an answer with "stop" too, on an id of its
    own text: with stop strings, only a last id among the request's `stop_token_ids` is known to be
    a stop token."""
    if finish_reason != "stop" or not token_ids or sampling_params.get("include_stop_str_in_output"):
        return False
    return not sampling_params.get("stop") or token_ids[-1] in (sampling_params.get("stop_token_ids") or ())


def common_suffix(a: list[int], b: list[int]) -> tuple[int, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return tuple(a[len(a) - n :])


class EngineProbes:
    """What each deployment's engine takes, checked once per deployment (`Deployment.key`)."""

    def __init__(self) -> None:
        self._known: dict[str, Engine | None] = {}
        self.probes = 0

    async def engine(self, client: httpx.AsyncClient, transport: EngineHttp, deployment: Deployment) -> Engine | None:
        """The deployment's token-in engine, or None when it has none (or could not be reached:
        then it is asked again on a later call)."""
        if deployment.key in self._known:
            return self._known[deployment.key]
        self.probes += 1
        try:
            engine = await self._probe(client, transport, deployment)
        except (httpx.HTTPError, RetryableBackendError, EngineRejected) as exc:
            logger.warning("agl_proxy: cannot probe %s for token-in endpoints: %s", deployment.label, exc)
            return None
        self._known[deployment.key] = engine
        if engine is None:
            logger.info(
                "agl_proxy: %s has no token-in endpoints (vLLM --enable-scale-out): rendered path", deployment.label
            )
        elif not engine.close:
            logger.warning(
                "agl_proxy: %s: the chat template's turn close is unclear; calls are rendered whole", deployment.label
            )
        return engine

    async def _probe(self, client: httpx.AsyncClient, transport: EngineHttp, deployment: Deployment) -> Engine | None:
        root = server_root(deployment.api_base or "")
        headers = backend_headers(deployment, "", "")
        response = await client.get(f"{root}/openapi.json", headers=headers, timeout=_PROBE_TIMEOUT_S)
        paths = (json_object_or_none(response.content) or {}).get("paths") if response.status_code == 200 else None
        if not isinstance(paths, dict) or not all(p in paths for p in (RENDER, GENERATE, DERENDER)):
            return None
        models = await client.get(f"{root}/v1/models", headers=headers, timeout=_PROBE_TIMEOUT_S)
        cards = (json_object_or_none(models.content) or {}).get("data") or []
        lengths = [c.get("max_model_len") for c in cards if isinstance(c, dict) and c.get("id") == deployment.model]
        max_model_len = lengths[0] if lengths and isinstance(lengths[0], int) else None
        close = await self._turn_close(transport, deployment, headers)
        return Engine(root, max_model_len, close, await self._text_of(transport, deployment, headers, close))

    @staticmethod
    async def _text_of(
        transport: EngineHttp, deployment: Deployment, headers: Mapping[str, str], ids: tuple[int, ...]
    ) -> str:
        text = await detokenize(transport, deployment, headers, list(ids)) if ids else None
        return text.strip() if text is not None else ""

    @staticmethod
    async def _turn_close(transport: EngineHttp, deployment: Deployment, headers: Mapping[str, str]) -> tuple[int, ...]:
        """The ids after an assistant turn's content: the common tail of two one-turn
        conversations whose answers differ ("a" and "b"), shown only when the rest differs."""
        rendered = []
        for text in ("a", "b"):
            body = {
                "model": deployment.model,
                "messages": [{"role": "user", "content": "."}, {"role": "assistant", "content": text}],
                "add_generation_prompt": False,
            }
            rendered.append(list((await post_json(transport, deployment, RENDER, body, headers))["token_ids"]))
        first, second = rendered
        close = common_suffix(first, second)
        if len(close) >= min(len(first), len(second)):
            return ()
        return close
