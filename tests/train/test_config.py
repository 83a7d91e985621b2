"""agl_train/config.yaml composed over verl's ppo_trainer, and the training and runner settings read from it."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from agl_store.sqlite import SQLiteStore
from agl_train.core.aggregate import Limits
from agl_train.runner.runner_settings import RunnerSettings
from agl_train.verl_glue.config import compose_config, settings_from_config


@pytest.fixture(scope="module")
def config():
    return compose_config()


def test_config_yaml_sets_agls_keys_and_the_verl_defaults_that_run(config) -> None:
    assert OmegaConf.to_container(config.agentlightning) == {
        "agl_base_url": "http://localhost:8080",
        "agl_advertised_url": None,
        "agl_key": "",
        "tool_call_parser": "hermes",
        "max_concurrency": None,
        "hooks": None,
        "rollout_timeout_seconds": 1800,
        "update_in_flight": "continue",
        "update_drain_timeout_seconds": 60,
        "update_hold_seconds": 3600,
        "local": {"agent_class": None, "env_map": {}},
        "k8s": {"job_template_path": None},
        "reward_fillna_value": 0.0,
        "max_ppo_update_times": None,
        "max_token_staleness": None,
        "trace_aggregator": {
            "level": "trajectory",
            "trajectory_max_prompt_length": 2048,
            "trajectory_max_response_length": 8192,
            "superseded": "drop",
        },
        "async_rollout": {"enabled": False, "async_train_batch_size": None},
        "retention": {"keep_steps": None},
    }
    assert config.algorithm.enable_rollout_level_advantage is True
    assert config.algorithm.adv_estimator == "grpo"  # verl's default, gae, needs a critic
    assert config.critic.enable is False
    assert list(config.trainer.logger) == ["console", "file"]  # verl's default adds wandb
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "auto"
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "per_rollout_mean"
    assert config.actor_rollout_ref.actor.calculate_entropy is True
    assert config.actor_rollout_ref.rollout.mode == "async"
    assert config.data.filter_overlong_prompts is False
    assert config.trainer.use_v1 is False  # verl's default is its v1 trainer; AglTrainer extends the legacy one


def test_upstream_verl_keys_still_resolve(config) -> None:
    assert config.actor_rollout_ref.actor.clip_ratio == 0.2
    assert config.data.train_batch_size == 1024
    assert config.algorithm.gamma == 1.0
    assert config.actor_rollout_ref.actor.rollout_n == config.actor_rollout_ref.rollout.n  # an interpolation
    assert config.actor_rollout_ref.actor.policy_loss.clip_cov_ratio == 0.0002  # verl's key beside agl's override


def test_runner_settings_from_the_defaults(config) -> None:
    settings = RunnerSettings.from_config(config)
    assert (settings.agl_base_url, settings.agl_key, settings.rollout_timeout_seconds) == (
        "http://localhost:8080",
        "",
        1800.0,
    )
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


def test_the_defaults_pass_agls_checks(config) -> None:
    from agl_train.verl_glue.config import trainer_settings

    settings, _ = trainer_settings(config)
    assert settings.per_rollout_mean


@pytest.mark.parametrize(
    "override, message",
    [
        ("algorithm.adv_estimator=gae", r"adv_estimator=gae .*needs a critic.*; set algorithm.adv_estimator=grpo"),
        ("algorithm.adv_estimator=remax", r"algorithm.adv_estimator=remax .*greedy baseline"),
        ("critic.enable=true", r"critic.enable=true .*set critic.enable=false"),
        ("trainer.critic_warmup=2", r"trainer.critic_warmup=2 .*set trainer.critic_warmup=0"),
        (
            "algorithm.rollout_correction.bypass_mode=true",
            r"bypass_mode=true .*per_rollout_mean loss.*rollout_is / rollout_rs; set .*bypass_mode=false",
        ),
        ("algorithm.filter_groups.enable=true", r"filter_groups.enable=true"),
        ("data.gen_batch_size=8", r"data.gen_batch_size=8 .*set data.gen_batch_size=null"),
        ("trainer.validation_data_dir=/tmp/val", r"trainer.validation_data_dir=/tmp/val"),
        ("trainer.log_val_generations=4", r"trainer.log_val_generations=4"),
        ("trainer.use_v1=true", r"trainer.use_v1=true .*legacy RayPPOTrainer.*; set trainer.use_v1=false"),
        ("global_profiler.steps=[1,2]", r"global_profiler.steps=\[1, 2\] .*profiler.*; set global_profiler.steps=null"),
        ("trainer.esi_redundant_time=60", r"trainer.esi_redundant_time=60 .*; set trainer.esi_redundant_time=0"),
        ("actor_rollout_ref.actor.checkpoint.async_save=true", r"async_save=true .*finalise"),
        ("distillation.enabled=true", r"distillation.enabled=true .*teacher.*; set distillation.enabled=false"),
    ],
)
def test_verl_keys_agl_would_not_honour_are_refused_with_the_key_to_set(override, message) -> None:
    from agl_train.verl_glue.config import trainer_settings

    with pytest.raises(ValueError, match=message):
        trainer_settings(compose_config([override]))


def test_a_gae_config_without_agls_overlay_is_refused_too() -> None:
    from agl_train.verl_glue.verl_config import check_verl_config

    with pytest.raises(ValueError, match="algorithm.adv_estimator=gae"):
        check_verl_config({"algorithm": {"adv_estimator": "gae"}})
    check_verl_config({"algorithm": {"adv_estimator": "rloo"}, "trainer": {"critic_warmup": 0}})


def test_without_flash_attn_the_actor_defaults_to_sdpa_with_one_message(caplog) -> None:
    from agl_train.verl_glue.attention import ATTN_KEY, resolve_attn_implementation

    config = compose_config()
    with caplog.at_level("WARNING", logger="agl_train.verl_glue.attention"):
        assert resolve_attn_implementation(config, flash_attn=False) == "sdpa"
        assert resolve_attn_implementation(config, flash_attn=False) == "sdpa"  # resolved: no second message
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert [r.getMessage() for r in caplog.records] == [f"flash-attn is not installed: the actor uses {ATTN_KEY}=sdpa"]


def test_with_flash_attn_the_actor_uses_it_and_explicit_choices_stay() -> None:
    from agl_train.verl_glue.attention import resolve_attn_implementation

    assert resolve_attn_implementation(compose_config(), flash_attn=True) == "flash_attention_2"
    eager = compose_config(["actor_rollout_ref.model.override_config.attn_implementation=eager"])
    assert resolve_attn_implementation(eager, flash_attn=False) == "eager"


def test_flash_attention_asked_for_without_flash_attn_names_the_key() -> None:
    from agl_train.verl_glue.attention import resolve_attn_implementation

    config = compose_config(["actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2"])
    with pytest.raises(ValueError, match=r"override_config.attn_implementation=flash_attention_2 needs the flash-attn"):
        resolve_attn_implementation(config, flash_attn=False)


def test_verl_reads_the_resolved_attention_from_the_model_config(config, tiny_model_path) -> None:
    from agl_train.verl_glue.attention import resolve_attn_implementation

    resolved = compose_config([f"actor_rollout_ref.model.path={tiny_model_path}"])
    resolve_attn_implementation(resolved, flash_attn=False)
    from verl.utils.config import omega_conf_to_dataclass

    model = omega_conf_to_dataclass(resolved.actor_rollout_ref.model)
    assert model.hf_config._attn_implementation == "sdpa"


def test_the_default_logger_runs_offline_and_writes_a_local_file(config, tmp_path, monkeypatch) -> None:
    import json

    from verl.utils.tracking import Tracking

    from agl_train.verl_glue._verl import DataProto  # noqa: F401  (imports verl with its import-time warnings silenced)

    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
    tracking = Tracking("agl-test", "defaults", default_backend=list(config.trainer.logger))
    tracking.log({"rollout/reward_mean": 0.5}, step=1)
    tracking.finish()
    assert "wandb" not in tracking.logger
    lines = (tmp_path / "agl-test" / "defaults.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 1, "data": {"rollout/reward_mean": 0.5}}]


def test_the_gpu_check_runs_on_agls_defaults(tiny_model_path, tmp_path) -> None:
    import json
    import os
    import subprocess
    import sys

    from .conftest import REPO_ROOT

    command = [sys.executable, "tests/gpu/gpu_check.py", "--model", str(tiny_model_path), "--base-url", "http://x"]
    done = subprocess.run(
        [*command, "--dry-run", "--out", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    tools, resumed = (OmegaConf.load(tmp_path / f"config-{run}.yaml") for run in ("tools", "resume-async"))
    assert tools.algorithm.adv_estimator == "grpo" and tools.critic.enable is False
    assert list(tools.trainer.logger) == ["console", "file"]
    assert tools.actor_rollout_ref.model.override_config.attn_implementation == "auto"  # resolved by the workers
    assert tools.trainer.save_freq == tools.trainer.test_freq == tools.trainer.total_training_steps
    assert tools.actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser == "hermes"
    # The resume takes back the groups an async checkpoint carried, under the schedule it was saved with.
    assert resumed.trainer.resume_from_path.endswith("checkpoints/async/global_step_1")
    checked = json.loads(done.stdout.strip().splitlines()[-1])
    assert checked["logprobs"] is True and checked["async_groups_carried"] == 4
    assert "groups_in_flight" in checked["changed_schedule_refused"]
    assert resumed.agentlightning.async_rollout.enabled is True


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
    with pytest.raises(ValueError, match="trace_aggregator.superseded must be one of"):
        settings_from_config(with_overrides(config, ["agentlightning.trace_aggregator.superseded=keep"]))
    masked = ["agentlightning.trace_aggregator.superseded=mask"]
    assert (
        settings_from_config(config).superseded,
        settings_from_config(with_overrides(config, masked)).superseded,
    ) == (
        "drop",
        "mask",
    )

    settings = settings_from_config(
        with_overrides(config, async_on + ["agentlightning.async_rollout.async_train_batch_size=9"])
    )
    assert (settings.async_rollout, settings.async_train_batch_size) == (True, 9)


def test_rollout_concurrency_defaults_to_every_rollout_of_a_step_in_one_wave() -> None:
    from agl_train.runner.dispatch import RolloutDispatcher

    config = compose_config(["data.train_batch_size=64", "actor_rollout_ref.rollout.n=8"])
    settings = RunnerSettings.from_config(config)
    assert (settings.rollouts_in_flight, settings.rollout_concurrency, settings.waves(512)) == (512, 512, 1)
    assert settings.step_wait_seconds == 1800.0
    dispatcher = RolloutDispatcher.for_settings(SQLiteStore(":memory:"), runner=None, settings=settings)
    assert dispatcher.max_concurrency == 512


def test_a_lower_concurrency_runs_in_waves_and_the_step_waits_for_each() -> None:
    config = compose_config(
        [
            "data.train_batch_size=64",
            "actor_rollout_ref.rollout.n=8",
            "agentlightning.max_concurrency=64",
            "agentlightning.rollout_timeout_seconds=100",
        ]
    )
    settings = RunnerSettings.from_config(config)
    assert (settings.rollout_concurrency, settings.waves(512), settings.step_wait_seconds) == (64, 8, 800.0)
    assert settings.wait_seconds(10) == 100.0  # validation: 10 rollouts, one wave


def test_async_rollout_keeps_its_groups_in_flight_at_once() -> None:
    config = compose_config(
        [
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            "agentlightning.async_rollout.enabled=true",
            "agentlightning.async_rollout.async_train_batch_size=6",
        ]
    )
    assert RunnerSettings.from_config(config).rollout_concurrency == 12


def test_a_concurrency_that_cannot_run_names_the_key() -> None:
    with pytest.raises(ValueError, match="agentlightning.max_concurrency must be positive"):
        RunnerSettings.from_config(compose_config(["agentlightning.max_concurrency=0"]))


@pytest.mark.parametrize(
    "base_url, nodes, expected",
    [
        ("http://localhost:8080", 1, "http://localhost:8080"),
        ("http://localhost:8080", 3, "http://10.0.0.5:8080"),
        ("http://127.0.0.1:8080/", 2, "http://10.0.0.5:8080/"),
        ("https://[::1]/agl", 2, "https://10.0.0.5/agl"),
        ("http://gateway.internal:8080", 4, "http://gateway.internal:8080"),
    ],
)
def test_the_advertised_url_replaces_a_loopback_host_only_in_a_multi_node_cluster(base_url, nodes, expected) -> None:
    from agl_train.runner.runner_settings import advertised_url

    assert advertised_url(base_url, "10.0.0.5", nodes) == expected


def test_the_trainer_and_agents_reach_the_gateway_at_the_advertised_url() -> None:
    from agl_train.runner.runner_settings import advertise_gateway

    config = compose_config()
    assert advertise_gateway(config, "10.0.0.5", nodes=1) is None
    assert RunnerSettings.from_config(config).agl_base_url == "http://localhost:8080"
    assert advertise_gateway(config, "10.0.0.5", nodes=2) == "http://10.0.0.5:8080"
    assert RunnerSettings.from_config(config).agl_base_url == "http://10.0.0.5:8080"
    explicit = compose_config(["agentlightning.agl_advertised_url=http://gw:9000"])
    assert advertise_gateway(explicit, "10.0.0.5", nodes=2) is None
    assert RunnerSettings.from_config(explicit).agl_base_url == "http://gw:9000"


def test_a_loopback_gateway_in_a_multi_node_cluster_is_refused_with_the_key_to_set() -> None:
    from agl_train.runner.runner_settings import actor_cluster_nodes, check_reachable_from_every_node

    settings = RunnerSettings.from_config(compose_config())
    assert actor_cluster_nodes() == 1  # outside a Ray actor: the driver sits beside the gateway
    check_reachable_from_every_node(settings, nodes=1)
    with pytest.raises(ValueError, match=r"3 nodes.*set agentlightning.agl_advertised_url"):
        check_reachable_from_every_node(settings, nodes=3)
