"""The tokenizer the token view decodes with: the configured one, else that of the model the trainer published.

    tokenizers = Tokenizers(configured=None)
    decoder, path = await tokenizers.get(store)   # (None, None) when no model is readable here

Without `--tokenizer`, the view reads the latest resource set and takes its LLMs' model (the
main one, `main_llm`, first): the `model` itself when it is a model directory on this machine
(verl serves a model under its path unless told another name), else the `root` that the LLM's
endpoint answers for it on `/v1/models` (vLLM's path of the model it serves). A path is used
only when it holds a tokenizer readable here; otherwise the page shows raw ids.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx

from agl_store.base import LightningStore
from agl_store.models import LLM, ResourcesUpdate

from ..runner.proxy_control import LLM_RESOURCE_NAME
from .token_view import TokenDecoder, load_tokenizer

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
MODELS_TIMEOUT_S = 5.0


def is_tokenizer_dir(path: str | None) -> bool:
    """True when `path` is a directory on this machine holding a tokenizer."""
    if not path:
        return False
    try:
        directory = Path(path)
        return directory.is_dir() and any((directory / name).is_file() for name in TOKENIZER_FILES)
    except OSError:
        return False


async def served_root(llm: LLM, timeout_s: float = MODELS_TIMEOUT_S) -> str | None:
    """The `root` (model path) that `llm.endpoint` answers on `/v1/models` for `llm.model`, or None."""
    headers = {"authorization": f"Bearer {llm.api_key}"} if llm.api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as http:
            answer = await http.get(llm.endpoint.rstrip("/") + "/models")
        answer.raise_for_status()
        models = answer.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        logger.info("no model path from %s/models: %r", llm.endpoint, exc)
        return None
    for entry in models:
        if isinstance(entry, dict) and entry.get("id") == llm.model and isinstance(entry.get("root"), str):
            return str(entry["root"])
    return None


async def published_model_path(latest: ResourcesUpdate) -> str | None:
    """The directory of the model a resource set's LLM serves, when readable here."""
    llms = [r for name, r in latest.resources.items() if isinstance(r, LLM) and name == LLM_RESOURCE_NAME]
    llms += [r for name, r in latest.resources.items() if isinstance(r, LLM) and name != LLM_RESOURCE_NAME]
    for llm in llms:
        if is_tokenizer_dir(llm.model):
            return llm.model
        root = await served_root(llm)
        if is_tokenizer_dir(root):
            return root
    return None


class Tokenizers:
    """The configured tokenizer, or the published model's; each path loaded once, each resource
    set looked at once (a new one is published per training step)."""

    def __init__(self, configured: str | None) -> None:
        self.configured = configured
        self._loaded: dict[str, TokenDecoder] = {}
        self._published: dict[str, str | None] = {}
        self._lock = asyncio.Lock()

    async def path(self, store: LightningStore) -> str | None:
        if self.configured is not None:
            return self.configured
        latest = await store.get_latest_resources()
        if latest is None:
            return None
        if latest.resources_id not in self._published:
            path = await published_model_path(latest)
            if path is not None and path not in self._loaded:
                try:
                    self._loaded[path] = await asyncio.to_thread(load_tokenizer, path)
                except Exception as exc:  # a published model is a best effort: raw ids then
                    logger.warning("the published model's tokenizer at %s did not load: %r", path, exc)
                    path = None
            self._published = {latest.resources_id: path}
        return self._published[latest.resources_id]

    async def get(self, store: LightningStore) -> tuple[TokenDecoder | None, str | None]:
        """The tokenizer and its path, or (None, None)."""
        async with self._lock:
            path = await self.path(store)
            if path is None:
                return None, None
            if path not in self._loaded:
                self._loaded[path] = await asyncio.to_thread(load_tokenizer, path)
            return self._loaded[path], path
