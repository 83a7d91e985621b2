"""Deployments: LiteLLM `model_list` entries parsed into what the proxy routes to.

A `model_list` entry is `{"model_name": ..., "litellm_params": {"model": "provider/name",
"api_base": ..., "api_key": ...}, "model_info": {...}}`, as in LiteLLM's config files.
Several entries may share one `model_name`: they are replicas of one model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .errors import NoBackendError, NotFoundError

# Providers whose HTTP API is OpenAI's, so agl's own pass-through can serve them and keep
# every extra field (token ids) that LiteLLM's adapters would move or drop.
OPENAI_COMPATIBLE_PROVIDERS = frozenset({"hosted_vllm", "openai", "text-completion-openai"})
DEFAULT_TIMEOUT_S = 600.0
# Keys of `litellm_params` that describe the connection rather than the request.
_CONNECTION_KEYS = frozenset(
    {
        "model",
        "api_base",
        "base_url",
        "api_key",
        "timeout",
        "stream_timeout",
        "max_retries",
        "rpm",
        "tpm",
        "organization",
    }
)


@dataclass(frozen=True)
class Deployment:
    """One backend serving one model name."""

    model_name: str
    provider: str
    model: str
    """The model name the backend knows (the provider prefix removed)."""
    api_base: Optional[str]
    api_key: Optional[str] = field(default=None, repr=False)
    timeout_s: float = DEFAULT_TIMEOUT_S
    model_version: Optional[str] = None
    request_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Extra `litellm_params` (e.g. `temperature`), applied to every request of this deployment."""
    litellm_params: Mapping[str, Any] = field(default_factory=dict, repr=False)
    use_litellm: bool = False
    """`model_info.agl_passthrough: false`: serve an OpenAI-compatible backend through LiteLLM anyway."""

    @property
    def key(self) -> str:
        """Identity across `update_model_list` calls: same key, same replica (load, cool-down)."""
        return f"{self.model_name}|{self.provider}/{self.model}@{self.api_base or ''}"

    @property
    def passthrough(self) -> bool:
        """True when agl forwards the call itself instead of going through LiteLLM."""
        return self.provider in OPENAI_COMPATIBLE_PROVIDERS and bool(self.api_base) and not self.use_litellm

    @property
    def is_vllm(self) -> bool:
        """vLLM understands `return_token_ids`; OpenAI itself would reject it."""
        if not self.passthrough:
            return False
        return self.provider == "hosted_vllm" or "api.openai.com" not in (self.api_base or "")

    @property
    def system(self) -> str:
        """The `gen_ai.system` of this deployment's spans."""
        return "vllm" if self.is_vllm else self.provider

    @property
    def label(self) -> str:
        """How errors, metrics and spans name this backend."""
        return self.api_base or f"{self.provider}/{self.model}"


def parse_deployment(entry: Mapping[str, Any]) -> Deployment:
    """One `model_list` entry as a `Deployment`; a malformed one raises ValueError saying why."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"model_list entries must be mappings, got {type(entry).__name__}")
    model_name = entry.get("model_name")
    params = entry.get("litellm_params")
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"model_list entry without a model_name: {dict(entry)!r}")
    if not isinstance(params, Mapping) or not isinstance(params.get("model"), str):
        raise ValueError(f"model_list entry {model_name!r} needs litellm_params.model (e.g. 'hosted_vllm/NAME')")
    provider, sep, model = params["model"].partition("/")
    if not sep:
        provider, model = "openai", params["model"]
    api_base = params.get("api_base") or params.get("base_url")
    info = entry.get("model_info") or {}
    version = info.get("agl_model_version", info.get("version"))
    return Deployment(
        model_name=model_name,
        provider=provider,
        model=model,
        api_base=str(api_base).rstrip("/") if api_base else None,
        api_key=params.get("api_key"),
        timeout_s=float(params.get("timeout") or DEFAULT_TIMEOUT_S),
        model_version=None if version is None else str(version),
        request_defaults={k: v for k, v in params.items() if k not in _CONNECTION_KEYS},
        litellm_params=dict(params),
        use_litellm=info.get("agl_passthrough") is False,
    )


class ModelRegistry:
    """The deployments of one `model_list`, by model name. Immutable: updates build a new one."""

    def __init__(self, model_list: Sequence[Mapping[str, Any]]) -> None:
        self.model_list: List[Dict[str, Any]] = [dict(entry) for entry in model_list]
        self.by_name: Dict[str, List[Deployment]] = {}
        for entry in self.model_list:
            deployment = parse_deployment(entry)
            self.by_name.setdefault(deployment.model_name, []).append(deployment)

    @property
    def model_names(self) -> List[str]:
        return list(self.by_name)

    @property
    def needs_litellm(self) -> bool:
        """True when some deployment is served through LiteLLM."""
        return any(not d.passthrough for replicas in self.by_name.values() for d in replicas)

    def resolve(self, model_name: Optional[str]) -> List[Deployment]:
        """The replicas of `model_name`; with one model configured, a missing name means it."""
        if not self.by_name:
            raise NoBackendError("no backend is registered with the proxy; call update_model_list or pass --backend")
        if not model_name:
            if len(self.by_name) == 1:
                return next(iter(self.by_name.values()))
            raise NotFoundError(f"the request names no model; known models: {', '.join(self.by_name)}")
        deployments = self.by_name.get(model_name)
        if deployments is None:
            raise NotFoundError(f"model {model_name!r} is not served here; known models: {', '.join(self.by_name)}")
        return deployments

    def redacted(self) -> List[Dict[str, Any]]:
        """The model list with api keys masked, for the admin route."""
        out = []
        for entry in self.model_list:
            params = dict(entry.get("litellm_params") or {})
            if params.get("api_key"):
                params["api_key"] = "***"
            out.append({**entry, "litellm_params": params})
        return out
