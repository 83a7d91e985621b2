"""agl's Hydra config (agl_train/config.yaml) read into checked settings.

`compose_config(overrides)` composes `agl_train/config.yaml` over verl's `ppo_trainer`;
`settings_from_config(config)` reads what the training data path needs and raises
ValueError for settings that cannot run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..algo.loss import LOSS_MODE
from ..core.aggregate import Limits, get_aggregator, limits_for_level
from ..core.call_graph import DEFAULT_SUPERSEDED, check_superseded
from ..runner.runner_settings import (
    RunnerSettings,
    actor_cluster_nodes,
    check_async_batch,
    check_reachable_from_every_node,
)
from .verl_config import check_verl_config

CONFIG_MODULE = "agl_train"
CONFIG_NAME = "config"
MAX_TOKEN_STALENESS_KEY = "agentlightning.max_token_staleness"


def compose_config(overrides: Sequence[str] = ()) -> Any:
    """The composed trainer config (an OmegaConf DictConfig) with Hydra `overrides` applied."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides))


@dataclass(frozen=True)
class TrainSettings:
    """The settings of the training data path, one field per config key it reads."""

    level: str
    limits: Limits
    reward_fillna_value: float
    max_ppo_update_times: int | None
    enable_rollout_level_advantage: bool
    per_rollout_mean: bool
    ppo_mini_batch_size: int
    rollout_n: int
    train_batch_size: int
    async_rollout: bool = False
    async_train_batch_size: int | None = None
    superseded: str = DEFAULT_SUPERSEDED
    max_token_staleness: int | None = None

    def __post_init__(self) -> None:
        get_aggregator(self.level)
        check_superseded(self.superseded)
        if self.max_token_staleness is not None and self.max_token_staleness < 0:
            raise ValueError(
                f"{MAX_TOKEN_STALENESS_KEY} must be a number of weight versions >= 0 or null, "
                f"got {self.max_token_staleness}"
            )
        if self.max_ppo_update_times is not None and self.max_ppo_update_times <= 0:
            raise ValueError(
                f"agentlightning.max_ppo_update_times must be positive or null, got {self.max_ppo_update_times}"
            )
        if self.async_rollout:
            check_async_batch(self.train_batch_size, self.async_train_batch_size)


def settings_from_config(config: Any) -> TrainSettings:
    """Read a composed trainer config into `TrainSettings` (ValueError when it cannot run)."""
    agl = config["agentlightning"]
    aggregator = agl["trace_aggregator"]
    level = str(aggregator["level"])
    get_aggregator(level)
    actor = config["actor_rollout_ref"]["actor"]
    asynchronous = agl.get("async_rollout") or {}
    cap = agl.get("max_ppo_update_times")
    size = asynchronous.get("async_train_batch_size")
    staleness = agl.get("max_token_staleness")
    if isinstance(staleness, bool) or not isinstance(staleness, (int, type(None))):
        raise ValueError(f"{MAX_TOKEN_STALENESS_KEY} must be an integer or null, got {staleness!r}")
    return TrainSettings(
        level=level,
        limits=limits_for_level(level, aggregator, config["data"]),
        reward_fillna_value=float(agl["reward_fillna_value"]),
        max_ppo_update_times=None if cap is None else int(cap),
        enable_rollout_level_advantage=bool(config["algorithm"].get("enable_rollout_level_advantage", True)),
        per_rollout_mean=str(actor["policy_loss"]["loss_mode"]) == LOSS_MODE,
        ppo_mini_batch_size=int(actor["ppo_mini_batch_size"]),
        rollout_n=int(config["actor_rollout_ref"]["rollout"].get("n", 1)),
        train_batch_size=int(config["data"]["train_batch_size"]),
        async_rollout=bool(asynchronous.get("enabled", False)),
        async_train_batch_size=None if size is None else int(size),
        superseded=str(aggregator.get("superseded", DEFAULT_SUPERSEDED)),
        max_token_staleness=staleness,
    )


def trainer_settings(config: Any) -> tuple[TrainSettings, RunnerSettings]:
    """Every agl setting of a trainer config, checked: the data path's, the runners', and no verl
    key that agl's loop would not honour (`verl_config.check_verl_config`: critics, GAE, rollout
    correction's bypass mode, a KL penalty in the reward, ...), and, inside a Ray actor of a multi-node cluster (the
    trainer's), no gateway URL that only one node reaches (`runner_settings.check_reachable_from_every_node`).
    ValueError names the key to change."""
    settings = settings_from_config(config)
    runner_settings = RunnerSettings.from_config(config)
    check_reachable_from_every_node(runner_settings, nodes=actor_cluster_nodes())
    check_verl_config(config)
    return settings, runner_settings
