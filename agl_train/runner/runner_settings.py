"""The rollout-execution part of the trainer config (`agentlightning.*` in agl_train/config.yaml).

The training data path reads its own settings (`agl_train.config.TrainSettings`); this is
what the trainer needs to run rollouts: where the gateway is, how to start an agent, how long
to wait, how many prompt groups to keep in flight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GATEWAY_TIMEOUT_S = 300.0
"""Timeout of every call the trainer makes to the gateway; fixed, not a config key."""


def _plain(value: Any) -> Any:
    """An OmegaConf node as plain Python containers; other values unchanged."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def check_async_batch(train_batch_size: int, async_train_batch_size: int | None) -> None:
    """Async rollout keeps more groups in flight than a step trains on; ValueError otherwise."""
    if async_train_batch_size is None or async_train_batch_size <= train_batch_size:
        raise ValueError(
            "agentlightning.async_rollout.async_train_batch_size must be strictly greater than "
            f"data.train_batch_size ({train_batch_size}), got {async_train_batch_size}"
        )


@dataclass(frozen=True)
class RunnerSettings:
    """How rollouts are executed. Exactly one of `agent_class` (local subprocesses) and
    `job_template_path` (Kubernetes Jobs) may be set; with neither, rollouts are left in the
    store's queue for runners started elsewhere.

    Keys that agl_train/config.yaml does not list, set with Hydra's `+` prefix:
    `+agentlightning.local.use_ray=true` runs local agents as Ray tasks on the trainer's Ray
    cluster; `+agentlightning.k8s.namespace=NAME` chooses the Jobs' namespace;
    `+agentlightning.agl_agent_key=KEY` is the key agents call the proxy with (its `--key`)
    when `agl_key` is the proxy's `--admin-key`.
    """

    agl_base_url: str = "http://localhost:8080"
    agl_key: str = ""
    """The gateway's admin key: the trainer pauses, resumes and repoints the proxy and uses its store."""
    agl_agent_key: str = ""
    """The key handed to agents in the LLM resource; empty: `agl_key` (a proxy with one key)."""
    hooks: str | None = None
    rollout_timeout_seconds: float = 1800.0
    agent_class: str | None = None
    env_map: Mapping[str, str] = field(default_factory=dict)
    local_use_ray: bool = False
    job_template_path: str | None = None
    k8s_namespace: str | None = None
    train_batch_size: int = 1
    rollout_n: int = 1
    async_enabled: bool = False
    async_train_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.rollout_timeout_seconds <= 0:
            raise ValueError(
                f"agentlightning.rollout_timeout_seconds must be positive, got {self.rollout_timeout_seconds}"
            )
        if self.agent_class and self.job_template_path:
            raise ValueError(
                "set one of agentlightning.local.agent_class and agentlightning.k8s.job_template_path, not both"
            )
        if self.train_batch_size <= 0 or self.rollout_n <= 0:
            raise ValueError(
                f"data.train_batch_size and rollout.n must be positive, got {self.train_batch_size}, {self.rollout_n}"
            )
        for name, path in self.env_map.items():
            if not isinstance(path, str) or not path:
                raise ValueError(f"agentlightning.local.env_map.{name} must be a dotted path such as 'input.question'")
        if self.async_enabled:
            check_async_batch(self.train_batch_size, self.async_train_batch_size)

    @property
    def agent_key(self) -> str:
        """What agents get as their key: `agl_agent_key`, else `agl_key`."""
        return self.agl_agent_key or self.agl_key

    @property
    def groups_in_flight(self) -> int:
        """Prompt groups kept running: `async_train_batch_size` in async mode, else one batch."""
        if self.async_enabled:
            assert self.async_train_batch_size is not None  # __post_init__ requires it in async mode
            return self.async_train_batch_size
        return self.train_batch_size

    @classmethod
    def from_config(cls, config: Any) -> RunnerSettings:
        """Read a composed trainer config (DictConfig or nested dicts)."""
        agl = _plain(config["agentlightning"])
        local = agl.get("local") or {}
        asynchronous = agl.get("async_rollout") or {}
        size = asynchronous.get("async_train_batch_size")
        return cls(
            agl_base_url=str(agl["agl_base_url"]),
            agl_key=str(agl.get("agl_key") or ""),
            agl_agent_key=str(agl.get("agl_agent_key") or ""),
            hooks=agl.get("hooks"),
            rollout_timeout_seconds=float(agl["rollout_timeout_seconds"]),
            agent_class=local.get("agent_class"),
            env_map=dict(local.get("env_map") or {}),
            local_use_ray=bool(local.get("use_ray", False)),
            job_template_path=(agl.get("k8s") or {}).get("job_template_path"),
            k8s_namespace=(agl.get("k8s") or {}).get("namespace"),
            train_batch_size=int(config["data"]["train_batch_size"]),
            rollout_n=int(config["actor_rollout_ref"]["rollout"].get("n", 1)),
            async_enabled=bool(asynchronous.get("enabled")),
            async_train_batch_size=None if size is None else int(size),
        )
