"""The trainer config a run file asks for: agl's config, the CPU's defaults, the run, the file's keys.

What each layer sets, in order (a later one wins):
1. `agl_train/config.yaml` over verl's `ppo_trainer` (`compose_config`);
2. on the CPU only, `CPU_DEFAULTS`: one process, no compilation, batch sizes a 2-core machine trains in
   minutes, the file logger the step lines read; on GPUs, `GPU_DEFAULTS` (verl starts vLLM itself);
3. the run: the model, the agent, the proxy's URL, the steps, where checkpoints go (`run_settings`);
4. the file's `config:` keys; a key neither agl nor verl has is an error naming it.
Then the batch sizes are checked (`check_micro_batches`) and agl's settings (`trainer_settings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..verl_glue.config import compose_config, trainer_settings
from .errors import RunFileError
from .run_file import RunFile

CPU_DEFAULTS: Mapping[str, Any] = {
    "actor_rollout_ref.actor.strategy": "fsdp",
    "actor_rollout_ref.actor.use_torch_compile": False,
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,  # compiling costs more than it saves here
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.entropy_coeff": 0,
    # 4 tasks × 4 rollouts a step, one mini-batch of 2 tasks (8 rows) at a time, micro-batches of 4 rows:
    # with a real vocabulary a row's logits are 152k floats a token, and 8 rows of ~600 tokens (the
    # word_lookup example's) held 9.4 GB in the trainer until the OOM killer ended it on a 23 GB machine.
    "data.train_batch_size": 4,
    "actor_rollout_ref.rollout.n": 4,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "data.dataloader_num_workers": 0,
    "agentlightning.trace_aggregator.trajectory_max_prompt_length": 512,
    "agentlightning.trace_aggregator.trajectory_max_response_length": 256,
    "agentlightning.rollout_timeout_seconds": 300,
    "trainer.logger": ["file"],  # the step lines follow verl's file logger
    "trainer.val_before_train": True,
    "trainer.save_freq": -1,
    "trainer.resume_mode": "disable",
}
"""The CPU path's defaults (`run_ppo_on_cpu`: one process, vLLM started beside it); any can be set in `config:`."""
GPU_DEFAULTS: Mapping[str, Any] = {
    "actor_rollout_ref.rollout.name": "vllm",  # `???` (required) in verl's config; verl starts the servers
    "trainer.logger": ["console", "file"],
}
"""verl's path on GPUs: what it needs that agl's config leaves to the user."""

_MISSING = object()


def run_settings(run: RunFile, model: Path, proxy_url: str) -> dict[str, Any]:
    """What the run itself fixes: the model `model` (the copy vLLM serves on the CPU), the agent, the proxy,
    the steps (validating before the first and after the last), where checkpoints go."""
    return {
        "actor_rollout_ref.model.path": str(model),
        "agentlightning.local.agent_class": run.agent_class,
        "agentlightning.agl_base_url": proxy_url,
        "trainer.total_training_steps": run.steps,
        "trainer.total_epochs": run.steps,  # at least one step an epoch: the steps end the run
        "trainer.test_freq": run.steps,
        "trainer.default_local_dir": str(run.out / "checkpoints"),
        "trainer.experiment_name": run.out.name,
    }


def compose_run_config(run: RunFile, model: Path, proxy_url: str, cpu: bool) -> Any:
    """The checked trainer config of `run` (see the module's layers); RunFileError names the key."""
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    config = compose_config()
    with open_dict(config):
        for name, path in run.env_map.items():
            config.agentlightning.local.env_map[name] = path
    layers = [CPU_DEFAULTS if cpu else GPU_DEFAULTS, run_settings(run, model, proxy_url)]
    for layer in layers:
        for key, value in layer.items():
            OmegaConf.update(config, key, value, merge=True)
    for key, value in run.settings.items():
        if OmegaConf.select(config, key, default=_MISSING) is _MISSING and not _open_parent(config, key):
            raise RunFileError(run.where, f"config.{key}", "neither agl's nor verl's config has this key")
        try:
            OmegaConf.update(config, key, value, merge=True, force_add=True)
        except OmegaConfBaseException as exc:
            raise RunFileError(run.where, f"config.{key}", str(exc).splitlines()[0]) from None
    check_micro_batches(config, run.where)
    try:
        trainer_settings(config)
    except ValueError as exc:
        raise RunFileError(run.where, "config", str(exc)) from None
    return config


def _open_parent(config: Any, key: str) -> bool:
    """Whether `key` goes into a mapping that takes any key (`engine_kwargs.vllm`, `override_config`, ...)."""
    from omegaconf import DictConfig, OmegaConf

    parent = OmegaConf.select(config, key.rpartition(".")[0]) if "." in key else config
    return isinstance(parent, DictConfig) and len(parent) == 0


def check_micro_batches(config: Any, where: str) -> None:
    """verl takes whole micro-batches: an update is whole mini-batches of `ppo_mini_batch_size × rollout.n` rows,
    which each micro-batch size (`ppo_micro_batch_size_per_gpu`, `log_prob_micro_batch_size_per_gpu`) must divide."""
    from omegaconf import OmegaConf

    actor = config.actor_rollout_ref.actor
    rows = int(actor.ppo_mini_batch_size) * int(config.actor_rollout_ref.rollout.n)
    for key in ("actor.ppo_micro_batch_size_per_gpu", "rollout.log_prob_micro_batch_size_per_gpu"):
        size = OmegaConf.select(config, f"actor_rollout_ref.{key}")
        if size is not None and rows % int(size):
            raise RunFileError(
                where,
                f"config.actor_rollout_ref.{key}",
                f"{size} does not divide a mini-batch of {rows} rows (actor.ppo_mini_batch_size "
                f"{actor.ppo_mini_batch_size} × rollout.n {config.actor_rollout_ref.rollout.n}); "
                "verl takes whole micro-batches",
            )
