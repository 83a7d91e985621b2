"""agl's Hydra config read into checked settings (its defaults: tests/trainer/test_config.py)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from agl_train.aggregate import Limits
from agl_train.config import compose_config, settings_from_config


@pytest.fixture(scope="module")
def config():
    return compose_config()


def with_overrides(config, dotlist):
    """The composed config with `key=value` overrides (cheaper than composing again)."""
    return OmegaConf.merge(config, OmegaConf.from_dotlist(dotlist))


def test_upstream_options_still_work(config) -> None:
    assert config.actor_rollout_ref.actor.clip_ratio_c == 3.0
    assert compose_config(["data.max_prompt_length=100"]).data.max_prompt_length == 100


def test_settings_pick_the_limits_of_the_level(config) -> None:
    trajectory = settings_from_config(config)
    transition = settings_from_config(
        with_overrides(
            config,
            [
                "agentlightning.trace_aggregator.level=transition",
                "data.max_prompt_length=4096",
                "data.max_response_length=2048",
                "agentlightning.max_ppo_update_times=2",
            ],
        )
    )

    assert (trajectory.level, trajectory.limits, trajectory.per_rollout_mean) == (
        "trajectory",
        Limits(2048, 8192),
        True,
    )
    assert (transition.level, transition.limits, transition.max_ppo_update_times) == (
        "transition",
        Limits(4096, 2048),
        2,
    )


def test_bad_settings_fail_when_read(config) -> None:
    with pytest.raises(ValueError, match="valid levels"):
        settings_from_config(with_overrides(config, ["agentlightning.trace_aggregator.level=turn"]))
    async_on = ["agentlightning.async_rollout.enabled=true", "data.train_batch_size=8"]
    with pytest.raises(ValueError, match="async_train_batch_size"):
        settings_from_config(
            with_overrides(config, async_on + ["agentlightning.async_rollout.async_train_batch_size=8"])
        )
    with pytest.raises(ValueError, match="max_ppo_update_times"):
        settings_from_config(with_overrides(config, ["agentlightning.max_ppo_update_times=0"]))

    settings = settings_from_config(
        with_overrides(config, async_on + ["agentlightning.async_rollout.async_train_batch_size=9"])
    )
    assert (settings.async_rollout, settings.async_train_batch_size) == (True, 9)
