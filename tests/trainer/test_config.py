"""agl_train/config.yaml composed over verl's ppo_trainer, and the runner settings read from it."""

from __future__ import annotations

import pytest

from agl_train.runner.settings import RunnerSettings
from agl_train.settings import compose_config


@pytest.fixture(scope="module")
def config():
    return compose_config()


def test_every_agl_default_is_spec_section_5(config) -> None:
    from omegaconf import OmegaConf

    assert OmegaConf.to_container(config.agentlightning) == {
        "agl_base_url": "http://localhost:8080",
        "agl_key": "",
        "hooks": None,
        "rollout_timeout_seconds": 1800,
        "local": {"agent_class": None, "env_map": {}},
        "k8s": {"job_template_path": None},
        "reward_fillna_value": 0.0,
        "max_ppo_update_times": None,
        "trace_aggregator": {
            "level": "trajectory",
            "trajectory_max_prompt_length": 2048,
            "trajectory_max_response_length": 8192,
        },
        "async_rollout": {"enabled": False, "async_train_batch_size": None},
    }
    assert config.algorithm.enable_rollout_level_advantage is True
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "per_rollout_mean"
    assert config.actor_rollout_ref.actor.calculate_entropy is True
    assert config.actor_rollout_ref.rollout.mode == "async"
    assert config.data.filter_overlong_prompts is False


def test_upstream_verl_keys_still_resolve(config) -> None:
    assert config.actor_rollout_ref.actor.clip_ratio == 0.2
    assert config.data.train_batch_size == 1024
    assert config.algorithm.adv_estimator == "gae"
    assert config.actor_rollout_ref.actor.rollout_n == config.actor_rollout_ref.rollout.n  # an interpolation
    assert config.actor_rollout_ref.actor.policy_loss.clip_cov_ratio == 0.0002  # verl's key beside agl's override


def test_runner_settings_from_the_defaults(config) -> None:
    settings = RunnerSettings.from_config(config)
    assert (settings.agl_base_url, settings.agl_key, settings.rollout_timeout_seconds) == ("http://localhost:8080", "", 1800.0)
    assert (settings.agent_class, settings.job_template_path, settings.groups_in_flight) == (None, None, 1024)


def test_overrides_reach_the_runner_settings() -> None:
    config = compose_config(
        [
            "agentlightning.local.agent_class=examples.calc_agent.agent:CalcAgent",
            "+agentlightning.local.env_map.QUESTION=input.question",
            "+agentlightning.local.use_ray=true",
            "agentlightning.agl_key=admin-key",
            "+agentlightning.agl_agent_key=agent-key",
            "agentlightning.async_rollout.enabled=true",
            "agentlightning.async_rollout.async_train_batch_size=12",
            "data.train_batch_size=8",
        ]
    )
    settings = RunnerSettings.from_config(config)
    assert settings.env_map == {"QUESTION": "input.question"} and settings.local_use_ray
    assert settings.groups_in_flight == 12
    assert (settings.agl_key, settings.agent_key) == ("admin-key", "agent-key")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"async_enabled": True, "async_train_batch_size": 8, "train_batch_size": 8}, "strictly greater"),
        ({"async_enabled": True, "async_train_batch_size": None}, "strictly greater"),
        ({"agent_class": "a:B", "job_template_path": "job.j2"}, "not both"),
        ({"rollout_timeout_seconds": 0}, "must be positive"),
        ({"env_map": {"QUESTION": ""}}, "dotted path"),
    ],
)
def test_settings_that_cannot_run_are_refused(changes, message) -> None:
    with pytest.raises(ValueError, match=message):
        RunnerSettings(**changes)
