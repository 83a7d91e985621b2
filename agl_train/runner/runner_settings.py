"""The rollout-execution part of the trainer config (`agentlightning.*` in agl_train/config.yaml).

The training data path reads its own settings (`agl_train.verl_glue.config.TrainSettings`); this is
what the trainer needs to run rollouts: where the gateway is, how to start an agent, how long
to wait, how many prompt groups to keep in flight and how many rollouts to run at once.
"""

from __future__ import annotations

import ipaddress
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

logger = logging.getLogger(__name__)

ADVERTISED_URL_KEY = "agentlightning.agl_advertised_url"

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


def is_loopback_url(url: str) -> bool:
    """Whether `url`'s host is this machine only (`localhost`, 127.0.0.0/8, ::1)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def advertised_url(base_url: str, node_ip: str, nodes: int) -> str:
    """`base_url` as the other nodes of a `nodes`-node cluster reach it: a loopback host becomes
    `node_ip` (the node the gateway runs on) when there is more than one node; otherwise unchanged."""
    if nodes <= 1 or not is_loopback_url(base_url):
        return base_url
    parts = urlsplit(base_url)
    host = f"[{node_ip}]" if ":" in node_ip else node_ip
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def ray_cluster() -> tuple[str, int]:
    """(this node's IP, alive nodes) of the Ray cluster this process is connected to; ("", 1) without one."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return "", 1
    return ray.util.get_node_ip_address(), sum(1 for node in ray.nodes() if node.get("Alive"))


def actor_cluster_nodes() -> int:
    """Alive nodes of the Ray cluster when called inside a Ray actor (the trainer's task runner, which
    Ray may place on any node); 1 elsewhere: the driver runs beside the gateway, the CPU path has no Ray."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return 1
    return ray_cluster()[1]


def advertise_gateway(config: Any, node_ip: str, nodes: int) -> str | None:
    """On the driver (the gateway's node), after `ray.init`, with `ray_cluster()`: set
    `agentlightning.agl_advertised_url` when it is null to `agl_base_url` with a loopback host
    replaced by `node_ip` if the cluster has more than one node, so the trainer actor and the
    agents, placed on any node, reach the gateway. Returns the URL set, None when nothing changed."""
    from omegaconf import open_dict

    agl = config["agentlightning"]
    if agl.get("agl_advertised_url") is not None:
        return None
    url = advertised_url(str(agl["agl_base_url"]), node_ip, nodes)
    if url == agl["agl_base_url"]:
        return None
    with open_dict(agl):
        agl["agl_advertised_url"] = url
    logger.info("%s=%s: agl_base_url is loopback and the cluster has %d nodes", ADVERTISED_URL_KEY, url, nodes)
    return url


def check_reachable_from_every_node(settings: RunnerSettings, nodes: int) -> None:
    """A loopback gateway URL reaches the gateway only from its own node: with more than one node,
    ValueError naming `agentlightning.agl_advertised_url`."""
    if nodes > 1 and is_loopback_url(settings.agl_base_url):
        raise ValueError(
            f"agentlightning.agl_base_url={settings.agl_base_url} is loopback but the Ray cluster has {nodes} nodes, "
            f"and the trainer and the agents may run on any of them: set {ADVERTISED_URL_KEY} to a URL of the "
            "gateway every node reaches (advertise_gateway sets it from the driver's node IP when it is null)"
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
    """Where the trainer and the agents reach the gateway: `agentlightning.agl_advertised_url` when it
    is set, else `agentlightning.agl_base_url`."""
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
    max_concurrency: int | None = None
    """Rollouts run at once (`agentlightning.max_concurrency`); None: every rollout in flight."""

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
        if self.max_concurrency is not None and self.max_concurrency <= 0:
            raise ValueError(f"agentlightning.max_concurrency must be positive or null, got {self.max_concurrency}")

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

    @property
    def rollouts_in_flight(self) -> int:
        """Rollouts a step keeps in flight: its groups times `rollout.n`."""
        return self.groups_in_flight * self.rollout_n

    @property
    def rollout_concurrency(self) -> int:
        """Rollouts the dispatcher runs at once: `max_concurrency`, else all of a step's in one wave."""
        return self.max_concurrency if self.max_concurrency is not None else self.rollouts_in_flight

    def waves(self, rollouts: int) -> int:
        """How many rounds `rollouts` rollouts take at `rollout_concurrency` at a time."""
        return max(math.ceil(rollouts / self.rollout_concurrency), 1)

    def wait_seconds(self, rollouts: int) -> float:
        """How long to wait for `rollouts` rollouts: one `rollout_timeout_seconds` per wave (each
        rollout may use its whole timeout, and a wave starts when slots free up)."""
        return self.waves(rollouts) * self.rollout_timeout_seconds

    @property
    def step_wait_seconds(self) -> float:
        """`wait_seconds` of a step's rollouts (`rollouts_in_flight`)."""
        return self.wait_seconds(self.rollouts_in_flight)

    @classmethod
    def from_config(cls, config: Any) -> RunnerSettings:
        """Read a composed trainer config (DictConfig or nested dicts)."""
        agl = _plain(config["agentlightning"])
        local = agl.get("local") or {}
        asynchronous = agl.get("async_rollout") or {}
        size = asynchronous.get("async_train_batch_size")
        concurrency = agl.get("max_concurrency")
        return cls(
            agl_base_url=str(agl.get("agl_advertised_url") or agl["agl_base_url"]),
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
            max_concurrency=None if concurrency is None else int(concurrency),
        )
