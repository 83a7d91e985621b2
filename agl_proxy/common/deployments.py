"""Deployments: LiteLLM `model_list` entries parsed into what the proxy routes to.

A `model_list` entry is `{"model_name": ..., "litellm_params": {"model": "provider/name",
"api_base": ..., "api_key": ...}, "model_info": {...}}`, as in LiteLLM's config files.
Several entries may share one `model_name`: they are replicas of one model.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .credentials import check_http_url, is_secret_name, mask_secrets, split_userinfo
from .errors import ModelNotFoundError, NoBackendError

# Providers whose HTTP API is OpenAI's, so agl's own pass-through can serve them and keep
# every extra field (token ids) that LiteLLM's adapters would move or drop.
OPENAI_COMPATIBLE_PROVIDERS = frozenset({"hosted_vllm", "openai", "text-completion-openai"})
DEFAULT_TIMEOUT_S = 600.0
# Keys of `litellm_params` that describe the connection, routing or billing rather than the
# request: never request defaults, so never in a backend's JSON body or a span.
CONNECTION_KEYS = frozenset(
    {
        "model",
        "api_base",
        "base_url",
        "api_key",
        "api_version",
        "api_type",
        "timeout",
        "stream_timeout",
        "max_retries",
        "num_retries",
        "rpm",
        "tpm",
        "organization",
        "extra_headers",
        "headers",
        "custom_llm_provider",
        "region_name",
        "tenant_id",
        "client_id",
        "deployment_id",
        "input_cost_per_token",
        "output_cost_per_token",
        "input_cost_per_second",
        "output_cost_per_second",
        "mock_response",
        "use_in_pass_through",
        "configurable_clientside_auth_params",
    }
)
# Provider-specific connection settings (`aws_region_name`, `vertex_project`, ...).
CONNECTION_PREFIXES = ("aws_", "vertex_", "azure_", "watsonx_", "litellm_", "bedrock_", "sagemaker_", "gcp_", "google_")
# Of the connection keys, these configure the proxy's routing, not LiteLLM's call.
ROUTING_KEYS = frozenset({"model", "base_url", "timeout", "stream_timeout", "max_retries", "num_retries", "rpm", "tpm"})
TOOL_CALL_ID_STYLES = ("random", "kimi_k2", "mistral")
"""vLLM's tool-call ids: `chatcmpl-tool-` and 16 hex digits (most parsers), Kimi-K2's `functions.NAME:INDEX`,
Mistral's 9 letters and digits."""
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def is_request_default(name: str) -> bool:
    """True for `litellm_params` keys that are request fields (`temperature`), not connection settings or secrets."""
    return name not in CONNECTION_KEYS and not name.startswith(CONNECTION_PREFIXES) and not is_secret_name(name)


@dataclass(frozen=True)
class Deployment:
    """One backend serving one model name."""

    model_name: str
    provider: str
    model: str
    """The model name the backend knows (the provider prefix removed)."""
    api_base: str | None
    """Without a `user:password@` part: that goes to the backend as `basic_auth`."""
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = DEFAULT_TIMEOUT_S
    model_version: str | None = None
    request_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Extra `litellm_params` that are request fields (e.g. `temperature`): defaults of every request."""
    litellm_params: Mapping[str, Any] = field(default_factory=dict, repr=False)
    use_litellm: bool = False
    """`model_info.agl_passthrough: false`: serve an OpenAI-compatible backend through LiteLLM anyway."""
    basic_auth: str | None = field(default=None, repr=False)
    """`Basic ...`, from the userinfo of the configured `api_base`."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """`extra_headers`: sent as HTTP headers on every pass-through call."""
    token_chain: bool = True
    """`model_info.agl_token_chain: off` keeps this deployment's chat calls on the rendered path."""
    keep_reasoning: bool = False
    """`model_info.agl_reasoning: keep`: the token chain keeps every earlier answer's sampled reasoning in
    the prompts it bridges, where the chat template would drop it (`template`, the default: prompts follow
    the template, and a call whose template drops reasoning is rendered whole)."""
    tool_call_ids: str = "random"
    """`model_info.agl_tool_call_ids`: how the engine's tool parser makes tool-call ids, which the token chain's
    answers carry as vLLM's chat endpoint would (one of TOOL_CALL_ID_STYLES)."""
    continue_generations: bool = False
    """`model_info.agl_continue_generations: true`: the token chain streams every generation from the engine,
    so a weight update can stop any of its calls and continue it after (`chain.continuation`); without it only
    the calls streamed to their clients can, and the others are drained."""

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
        """How errors, metrics and spans name this backend (never with credentials)."""
        return self.api_base or f"{self.provider}/{self.model}"

    @cached_property
    def litellm_kwargs(self) -> dict[str, Any]:
        """The connection settings LiteLLM's call takes (credentials included; never shown). Worked out once
        per deployment: callers spread it, never change it."""
        params = {k: v for k, v in self.litellm_params.items() if not is_request_default(k) and k not in ROUTING_KEYS}
        api_base = self.litellm_params.get("api_base") or self.litellm_params.get("base_url")
        if api_base:
            params["api_base"] = api_base
        return params


def _timeout(value: Any, where: str) -> float:
    if value is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}.litellm_params.timeout must be a positive number of seconds, got {value!r}")
    return float(value)


def _extra_headers(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}.litellm_params.extra_headers must be a mapping of header names to strings")
    for name, header in value.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise ValueError(f"{where}.litellm_params.extra_headers has an invalid header name {name!r}")
        if not isinstance(header, str) or any(c in header for c in "\r\n\x00"):
            raise ValueError(f"{where}.litellm_params.extra_headers.{name} must be a string without CR, LF or NUL")
    return dict(value)


def parse_deployment(entry: Any, where: str = "model_list entry") -> Deployment:
    """One `model_list` entry as a `Deployment`; a malformed one raises ValueError naming the field (`where` first)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a mapping with model_name and litellm_params, got {type(entry).__name__}")
    model_name = entry.get("model_name")
    params = entry.get("litellm_params")
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"{where}.model_name must be a non-empty string, got {model_name!r}")
    if not isinstance(params, Mapping) or not isinstance(params.get("model"), str):
        raise ValueError(f"{where}.litellm_params.model must be a string such as 'hosted_vllm/NAME'")
    provider, sep, model = params["model"].partition("/")
    if not sep:
        provider, model = "openai", params["model"]
    info = entry.get("model_info")
    if info is None:
        info = {}
    if not isinstance(info, Mapping):
        raise ValueError(f"{where}.model_info must be a mapping, got {type(info).__name__}")
    api_key = params.get("api_key")
    if api_key is not None and not isinstance(api_key, str):
        raise ValueError(f"{where}.litellm_params.api_key must be a string")
    api_base = params.get("api_base") or params.get("base_url")
    basic_auth = None
    if api_base:
        api_base, basic_auth = split_userinfo(check_http_url(api_base, f"{where}.litellm_params.api_base"))
        if basic_auth and api_key:
            raise ValueError(
                f"{where}.litellm_params: api_base carries user:password and api_key is set too; "
                "the backend can get only one Authorization header"
            )
    version = info.get("agl_model_version", info.get("version"))
    token_chain = info.get("agl_token_chain", "auto")
    if token_chain not in ("auto", "off"):
        raise ValueError(f"{where}.model_info.agl_token_chain must be 'auto' or 'off', got {token_chain!r:.50}")
    reasoning = info.get("agl_reasoning", "template")
    if reasoning not in ("template", "keep"):
        raise ValueError(f"{where}.model_info.agl_reasoning must be 'template' or 'keep', got {reasoning!r:.50}")
    tool_call_ids = info.get("agl_tool_call_ids", "random")
    if tool_call_ids not in TOOL_CALL_ID_STYLES:
        styles = ", ".join(TOOL_CALL_ID_STYLES)
        raise ValueError(f"{where}.model_info.agl_tool_call_ids must be one of {styles}, got {tool_call_ids!r:.50}")
    continue_generations = info.get("agl_continue_generations", False)
    if not isinstance(continue_generations, bool):
        raise ValueError(
            f"{where}.model_info.agl_continue_generations must be true or false, got {continue_generations!r:.50}"
        )
    return Deployment(
        model_name=model_name,
        provider=provider,
        model=model,
        api_base=api_base.rstrip("/") if api_base else None,
        api_key=api_key or None,
        timeout_s=_timeout(params.get("timeout"), where),
        model_version=None if version is None else str(version),
        request_defaults={k: v for k, v in params.items() if is_request_default(k)},
        litellm_params=dict(params),
        use_litellm=info.get("agl_passthrough") is False,
        basic_auth=basic_auth,
        headers=_extra_headers(params.get("extra_headers"), where),
        token_chain=token_chain == "auto",
        keep_reasoning=reasoning == "keep",
        tool_call_ids=tool_call_ids,
        continue_generations=continue_generations,
    )


def known_models(names: Sequence[str], limit: int = 10) -> str:
    """The first `limit` names, and how many more there are: an error message stays short."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def with_aliases(model_list: Sequence[Mapping[str, Any]], aliases: Mapping[str, str]) -> list[dict[str, Any]]:
    """`model_list` with each alias (a name or a LiteLLM wildcard such as `claude-*`) served as its model.

    An alias is the model's entries again under the alias's name, as LiteLLM's
    `router_settings.model_group_alias` makes it; ValueError names an alias of a model not in the list.
    """
    out = [dict(entry) for entry in model_list]
    for alias, target in aliases.items():
        entries = [{**entry, "model_name": alias} for entry in model_list if entry.get("model_name") == target]
        if not entries:
            names = [str(entry.get("model_name")) for entry in model_list]
            raise ValueError(
                f"alias {alias!r:.80} names {target!r:.80}, which is not served; known: {known_models(names)}"
            )
        out += entries
    return out


class ModelRegistry:
    """The deployments of one `model_list`, by model name. Immutable: updates build a new one."""

    def __init__(self, model_list: Sequence[Mapping[str, Any]]) -> None:
        self.by_name: dict[str, list[Deployment]] = {}
        for index, entry in enumerate(model_list):
            deployment = parse_deployment(entry, f"model_list[{index}]")
            self.by_name.setdefault(deployment.model_name, []).append(deployment)
        self.model_list: list[dict[str, Any]] = [dict(entry) for entry in model_list]
        # LiteLLM's wildcards (`model_name: "claude-*"`, `"*"`): the most specific pattern wins.
        self.patterns = sorted((name for name in self.by_name if "*" in name), key=lambda name: (-len(name), name))

    @property
    def model_names(self) -> list[str]:
        return list(self.by_name)

    @property
    def needs_litellm(self) -> bool:
        """True when some deployment is served through LiteLLM."""
        return any(not d.passthrough for replicas in self.by_name.values() for d in replicas)

    def resolve(self, model_name: str | None) -> list[Deployment]:
        """The replicas of `model_name`; with one model configured, a missing name means it."""
        if not self.by_name:
            raise NoBackendError("no backend is registered with the proxy; call update_model_list or pass --backend")
        if not model_name:
            # Aliases are the same deployments again, not another model to choose from.
            if len({tuple((d.provider, d.model, d.api_base) for d in r) for r in self.by_name.values()}) == 1:
                return next(iter(self.by_name.values()))
            raise ModelNotFoundError(f"the request names no model; known models: {known_models(self.model_names)}")
        deployments = self.by_name.get(model_name)
        if deployments is None:
            pattern = next((p for p in self.patterns if fnmatch.fnmatchcase(model_name, p)), None)
            deployments = self.by_name.get(pattern) if pattern is not None else None
        if deployments is None:
            raise ModelNotFoundError(
                f"model {model_name[:200]!r} is not served here; known models: {known_models(self.model_names)}"
            )
        return deployments

    def current(self, deployment: Deployment) -> Deployment:
        """The deployment of this list with `deployment`'s key (its version may differ), else `deployment`."""
        for replica in self.by_name.get(deployment.model_name, ()):
            if replica.key == deployment.key:
                return replica
        return deployment

    def redacted(self) -> list[dict[str, Any]]:
        """The model list with every secret-named field and URL password masked, for the admin route."""
        return [mask_secrets(entry) for entry in self.model_list]
