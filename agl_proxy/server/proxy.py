"""`LLMProxy`: the gateway served by uvicorn inside the caller's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import uvicorn

from agl_store.base import LightningStore
from agl_store.models import ProxyLLM
from agl_store.web.serving import bind_socket, start_uvicorn

from .app import create_app
from .settings import ProxySettings
from .state import ProxyState

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8080
STARTUP_TIMEOUT_S = 30.0
GRACEFUL_SHUTDOWN_S = 10  # uvicorn takes whole seconds


class LLMProxy:
    """An OpenAI-compatible proxy that records every call, token ids included, as a span.

    ```python
    proxy = LLMProxy(model_list=[{"model_name": "qwen", "litellm_params": {
        "model": "hosted_vllm/Qwen/Qwen2.5-0.5B", "api_base": "http://127.0.0.1:8000/v1"}}], store=store)
    await proxy.start()
    await store.add_resources({"main_llm": proxy.as_resource()})
    ...
    await proxy.stop()
    ```

    How calls are treated is `settings` (a `ProxySettings`), or its fields given as keyword
    arguments over it: `LLMProxy(..., logprobs=True, sampling_by_mode={"train": {"temperature":
    1.0}, "val": {"temperature": 0}}, require_token_ids=True)`. `port=0` picks a free port
    (read it back from `port` after `start()`). `store_app` is an ASGI app served on the
    same port (the embedded store's REST routes).

    `key` is what agents call the LLM routes with (`as_resource()` hands it out); `admin_key`
    is required on the admin routes (`/proxy/*`, `/metrics`) and `store_app`'s routes. Without
    `admin_key`, `key` is both (one key: whoever calls the model may also reconfigure the proxy).
    """

    def __init__(
        self,
        model_list: Sequence[Mapping[str, Any]] | None = None,
        store: LightningStore | None = None,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        key: str | None = None,
        *,
        admin_key: str | None = None,
        settings: ProxySettings | None = None,
        store_app: Any = None,
        advertise_url: str | None = None,
        **options: Any,
    ) -> None:
        self.host = host
        self.port = port
        self.key = key
        self.admin_key = key if admin_key is None else admin_key
        self.store = store
        # Fields of ProxySettings may come one by one; an unknown name is a TypeError naming it.
        self.settings = dataclasses.replace(settings or ProxySettings(), **options)
        self.state = ProxyState(model_list or [], store, self.settings)
        self._store_app = store_app
        self.advertise_url = advertise_url.rstrip("/") if advertise_url else None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None

    @property
    def model_list(self) -> list[dict[str, Any]]:
        return self.state.registry.model_list

    @property
    def bound_url(self) -> str:
        """`http://host:port` where the proxy listens (127.0.0.1 when it binds every interface)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The proxy's root URL: `advertise_url` when given (agents on other machines), else `bound_url`."""
        return self.advertise_url or self.bound_url

    @property
    def base_url(self) -> str:
        """The OpenAI base URL for calls without a rollout."""
        return self.url + "/v1"

    def is_running(self) -> bool:
        return self._task is not None and not self._task.done()

    def create_app(self) -> Any:
        """The ASGI app, for serving it some other way (tests use it with httpx's ASGITransport)."""
        return create_app(self.state, key=self.key, admin_key=self.admin_key, store_app=self._store_app, host=self.host)

    def update_model_list(self, model_list: Sequence[Mapping[str, Any]]) -> None:
        """Replace the backends at run time; calls in flight finish where they started."""
        self.state.update_model_list(model_list)

    async def start(self) -> None:
        """Serve until `stop()`. Returns once the port accepts connections.

        Raises OSError when the port is taken and RuntimeError when the server does not start.
        SIGINT / SIGTERM stay with the caller's handlers (the CLI installs its own, to stop the store too).
        """
        if self.is_running():
            raise RuntimeError(f"the proxy is already running at {self.url}")
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.create_app(),
            log_level="warning",
            lifespan="on",
            access_log=False,
            # Calls still running after this long are cut so that a hung backend cannot block stop().
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
        server = uvicorn.Server(config)
        try:
            self._task = await start_uvicorn(server, sock, timeout_s=STARTUP_TIMEOUT_S)
        except RuntimeError as exc:
            sock.close()
            raise RuntimeError(f"the proxy could not start on {self.host}:{self.port}") from (exc.__cause__ or exc)
        self._server = server
        self._socket = sock
        logger.info("agl_proxy serving %s at %s", ", ".join(self.state.registry.model_names) or "no models", self.url)

    async def stop(self) -> None:
        """Stop serving: calls in flight get uvicorn's grace period, buffered spans a flush."""
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        except (asyncio.CancelledError, SystemExit):
            pass
        except Exception:  # a failed shutdown must not hide the caller's own error
            logger.exception("agl_proxy: error while stopping")
        if self._socket is not None:
            self._socket.close()
        self._server = None
        self._socket = None
        self._task = None

    def as_resource(
        self,
        model: str | None = None,
        sampling_parameters: Mapping[str, Any] | None = None,
    ) -> ProxyLLM:
        """An LLM resource whose `get_base_url(rollout_id, attempt_id)` is the per-rollout URL.

        `model` may be left out when one model is configured. It carries `key`, never `admin_key`.
        """
        if model is None:
            names = self.state.registry.model_names
            if len(names) != 1:
                raise ValueError(f"as_resource needs model= when the proxy serves {len(names)} models: {names}")
            model = names[0]
        return ProxyLLM(
            endpoint=self.base_url, model=model, api_key=self.key, sampling_parameters=dict(sampling_parameters or {})
        )
