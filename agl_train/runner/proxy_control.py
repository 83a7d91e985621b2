"""The trainer's remote control of agl's proxy (the gateway: the proxy, with the store's routes on the same port).

`ProxyControl` is built lazily from `agentlightning.agl_base_url`, `agl_key` and a 300 s
timeout: constructing it opens nothing, the first call does. Per step the trainer registers
the rollout engine's replicas with the proxy and publishes the proxy as the rollouts' LLM
(`publish_replicas`), sets the sampling parameters every call runs with (`set_sampling`),
and around the weight update pauses the proxy, waits (bounded) for the calls in flight to
drain, cancelling those still running at the bound (`pause_for_update`), then `resume()`s it.

Every request's timeout follows from what it waits for: a pause that drains waits up to its
drain bound, plus the grace it gives cancelled calls, plus `PAUSE_MARGIN_S`; the others answer
at once and get the 300 s default. The trainer's pause also tells the proxy how long to hold the
calls that arrive during the update (`hold_s`), so they outlast an update and a checkpoint.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from agl_store.base import LightningStore
from agl_store.models import ProxyLLM

from .runner_settings import GATEWAY_TIMEOUT_S

LLM_RESOURCE_NAME = "main_llm"
"""The proxy's name in each resource set the trainer publishes."""
CANCEL_GRACE_S = 10.0
"""How long a pause that cancelled calls waits for them to answer their clients."""
PAUSE_MARGIN_S = 30.0
"""Added to a draining pause's own bound for its request's timeout: the network and a busy loop."""


class ProxyControlError(RuntimeError):
    """The proxy answered with an error status (`status_code`), or could not be reached (None)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ProxyControl:
    """Pause / state / resume / model list of one proxy, over HTTP, with its admin key (`--admin-key`).

    ```python
    proxy = ProxyControl("http://localhost:8080", key="")
    await proxy.update_model_list(vllm_model_list(["10.0.0.5:8000"], "Qwen/Qwen2.5-1.5B"))
    await proxy.pause(drain=True)
    ... update weights ...
    await proxy.resume()
    await proxy.aclose()
    ```
    """

    def __init__(
        self,
        base_url: str,
        key: str = "",
        *,
        timeout_s: float = GATEWAY_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = _without_v1(base_url)
        self.key = key
        self.timeout_s = timeout_s
        self._transport = transport
        self._http: httpx.AsyncClient | None = None

    @property
    def openai_base_url(self) -> str:
        """The proxy's OpenAI base URL (what an LLM resource's `endpoint` is)."""
        return self.base_url + "/v1"

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            headers = {"authorization": f"Bearer {self.key}"} if self.key else {}
            self._http = httpx.AsyncClient(
                base_url=self.base_url, headers=headers, timeout=self.timeout_s, transport=self._transport
            )
        return self._http

    async def _request(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, timeout: httpx.Timeout | None = None
    ) -> dict[str, Any]:
        """`timeout` replaces the client's own timeout for this request."""
        try:
            response = await self._client().request(
                method, path, json=body, timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout
            )
        except httpx.HTTPError as exc:
            raise ProxyControlError(f"{method} {self.base_url}{path} failed: {exc!r}") from exc
        if response.status_code >= 400:
            raise ProxyControlError(
                f"{method} {self.base_url}{path} answered {response.status_code}: {response.text[:500]}",
                response.status_code,
            )
        return response.json()

    async def state(self) -> dict[str, Any]:
        """`{"paused", "reason", "paused_at", "in_flight", "models", "spans_buffered"}`."""
        return await self._request("GET", "/proxy/state")

    async def pause(
        self,
        reason: str = "weight update",
        *,
        drain: bool = True,
        timeout_s: float | None = None,
        cancel_after_drain_timeout: bool = False,
        cancel_grace_s: float = CANCEL_GRACE_S,
        hold_s: float | None = None,
        stop_generations: bool = False,
    ) -> dict[str, Any]:
        """Hold new calls until `resume()` (each up to `hold_s`, default the proxy's `--hold`) and,
        with `drain`, wait (up to `timeout_s`) until the calls in flight are done;
        `cancel_after_drain_timeout` cancels those still running then and waits up to
        `cancel_grace_s` for them. `stop_generations`: the token chain's calls stop generating
        and park until the resume, then continue (on the weights served then); a drain does not
        wait for them. The request waits as long as that takes (no bound without `timeout_s`),
        plus `PAUSE_MARGIN_S`."""
        body: dict[str, Any] = {"reason": reason, "drain": drain}
        if stop_generations:
            body["stop_generations"] = True
        if hold_s is not None:
            body["hold"] = hold_s
        if timeout_s is not None:
            body["timeout"] = timeout_s
        if cancel_after_drain_timeout:
            body["cancel_after_drain_timeout"] = True
            body["cancel_grace"] = cancel_grace_s
        timeout = None
        if drain:
            grace = cancel_grace_s if cancel_after_drain_timeout else 0.0
            timeout = httpx.Timeout(None if timeout_s is None else timeout_s + grace + PAUSE_MARGIN_S)
        return await self._request("POST", "/proxy/pause", body, timeout)

    async def resume(self) -> dict[str, Any]:
        return await self._request("POST", "/proxy/resume")

    async def update_model_list(self, model_list: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Replace the proxy's backends (LiteLLM `model_list` entries); returns the list it serves."""
        answer = await self._request("POST", "/proxy/model_list", {"model_list": [dict(e) for e in model_list]})
        return answer["model_list"]

    async def set_sampling(
        self, by_mode: Mapping[str, Mapping[str, Any]], *, on_conflict: str = "override"
    ) -> dict[str, Any]:
        """The sampling parameters the proxy sends to the backend for the calls of each rollout
        mode (`{"train": {"temperature": 1.0, ...}, "val": {...}}`); with `on_conflict="override"`
        they replace what an agent asked for."""
        body = {"by_mode": {mode: dict(params) for mode, params in by_mode.items()}, "on_conflict": on_conflict}
        return await self._request("POST", "/proxy/sampling", body)

    async def wait_spans_exported(self, timeout_s: float = 60.0, poll_s: float = 0.05) -> bool:
        """Wait until the proxy has no span left to write (so a finished rollout's spans are
        all in the store); False if `timeout_s` passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if (await self.state()).get("spans_buffered", 0) == 0:
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(poll_s)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


async def served_model_name(server_address: str, timeout_s: float = 30.0) -> str:
    """The model id a vLLM replica serves (its `/v1/models`), which is what the proxy must ask for."""
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        answer = await http.get(server_root(server_address) + "/v1/models")
    answer.raise_for_status()
    return answer.json()["data"][0]["id"]


ROW_TOKENS = "row_tokens"
"""The sampling field of the row budget (`set_sampling`; the proxy's `agl_proxy.controls.sampling.ROW_TOKENS`)."""
ANY_MODEL = "*"
"""The wildcard model name (LiteLLM's spelling) the trained model is registered under too."""


async def publish_replicas(
    store: LightningStore,
    proxy: ProxyControl,
    server_addresses: Sequence[str],
    *,
    version: str,
    api_key: str | None = None,
    sampling_parameters: dict[str, Any] | None = None,
    published: dict[str, str] | None = None,
    continue_generations: bool = False,
) -> str:
    """Register the rollout engine's replicas with the proxy (one `model_list` entry each,
    tagged with the weight `version`) and publish a resource set whose `main_llm` is the proxy;
    returns its resources id. `published` (the caller's, kept across calls) maps what was
    published to its set: a call for the same version, replicas and resource reuses that set,
    so there is one set per weight version (one per step: the training page's rows), and a new
    id whenever anything changes, so runners never see a stale one. The proxy's model list is
    set every call all the same (a restarted proxy gets its replicas back).

    The replicas are registered under the name vLLM serves and under the wildcard `*`, so an
    agent that sends its own model name (Codex's `gpt-5.1-codex`, Claude Code's `claude-*` and
    its small background model) reaches the model being trained without being told its name,
    and with the request default `logprobs` (`vllm_model_list`), so every call records its
    sampled tokens' log-probs, which the update's off-policy correction reads, whether or not
    the proxy was started with `--logprobs`. `continue_generations`: every token-chain call can
    continue across a weight update (`model_info.agl_continue_generations`)."""
    if not server_addresses:
        raise ValueError("the rollout engine has no replica to register")
    served = await served_model_name(server_addresses[0])
    entries = [
        vllm_model_list(
            server_addresses,
            name,
            served_model=served,
            version=version,
            logprobs=True,
            continue_generations=continue_generations,
        )
        for name in (served, ANY_MODEL)
    ]
    await proxy.update_model_list(entries[0] + entries[1])
    resource = ProxyLLM(
        endpoint=proxy.openai_base_url,
        model=served,
        api_key=api_key,
        sampling_parameters=dict(sampling_parameters or {}),
    )
    key = json.dumps([version, list(server_addresses), resource.model_dump(mode="json")], sort_keys=True)
    if published is not None and key in published:
        return published[key]
    update = await store.add_resources({LLM_RESOURCE_NAME: resource})
    if published is not None:
        published.clear()  # only the latest can be asked for again
        published[key] = update.resources_id
    return update.resources_id


IN_FLIGHT_AT_UPDATE = ("continue", "drain", "cancel")
"""What a weight update does with the calls in flight (`agentlightning.update_in_flight`)."""


async def pause_for_update(
    proxy: ProxyControl, drain_timeout_s: float, hold_s: float | None = None, in_flight: str = "continue"
) -> dict[str, float]:
    """Pause the proxy for a weight update: the replicas may sleep and take new weights next.
    New calls are held by the proxy until `proxy.resume()` (up to `hold_s`). The calls in flight,
    by `in_flight`: `continue` has the token chain's stop generating and park (they continue on
    the new weights after the resume) and waits up to `drain_timeout_s` for the rest; `drain`
    waits up to `drain_timeout_s` for all; `cancel` waits for none. Those still running then are
    cancelled: a cancelled call fails its agent's request, and the rollout ends as its agent and
    runner decide (failed rollouts are counted, not trained)."""
    if in_flight not in IN_FLIGHT_AT_UPDATE:
        raise ValueError(f"in_flight must be one of {', '.join(IN_FLIGHT_AT_UPDATE)}, got {in_flight!r}")
    paused = await proxy.pause(
        "weight update",
        drain=True,
        timeout_s=0.0 if in_flight == "cancel" else drain_timeout_s,
        cancel_after_drain_timeout=True,
        hold_s=hold_s,
        stop_generations=in_flight == "continue",
    )  # the proxy's state once drained (or at the bound)
    return {
        "rollout/proxy_drained": float(bool(paused.get("drained"))),
        "rollout/proxy_in_flight_at_update": float(paused.get("in_flight", 0)),
        "rollout/proxy_calls_cancelled_at_update": float(paused.get("cancelled", 0)),
        "rollout/proxy_calls_parked_at_update": float(paused.get("parked", 0)),
    }


def vllm_model_list(
    server_addresses: Sequence[str],
    model_name: str,
    *,
    served_model: str | None = None,
    version: str | None = None,
    logprobs: bool = False,
    continue_generations: bool = False,
) -> list[dict[str, Any]]:
    """LiteLLM `model_list` entries for vLLM replicas (`host:port` or URLs), one per replica,
    all under `model_name`; `served_model` is the name vLLM serves (default `model_name`),
    `version` the weight version recorded in every span they serve. With `logprobs`, every
    request asks for the sampled tokens' log-probs (a request default, `litellm_params.logprobs`:
    a client that asks for them itself keeps its own value). With `continue_generations`, the
    token chain streams every generation, so a weight update can stop and continue any call."""
    entries = []
    for address in server_addresses:
        url = server_root(address) + "/v1"
        entry: dict[str, Any] = {
            "model_name": model_name,
            "litellm_params": {"model": f"hosted_vllm/{served_model or model_name}", "api_base": url},
        }
        if logprobs:
            entry["litellm_params"]["logprobs"] = True
        info: dict[str, Any] = {}
        if version is not None:
            info["agl_model_version"] = str(version)
        if continue_generations:
            info["agl_continue_generations"] = True
        if info:
            entry["model_info"] = info
        entries.append(entry)
    return entries


def server_root(address: str) -> str:
    """A server's root URL from `host:port` or a URL (`http://` when no scheme is given),
    without a trailing slash or `/v1`."""
    return _without_v1(address if "://" in address else f"http://{address}")


def _without_v1(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url
