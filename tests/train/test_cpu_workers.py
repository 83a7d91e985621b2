"""The CPU stand-in's actor without vLLM: verl's `ActorRolloutRefWorker` in this process, and its
checkpoints through verl's own checkpoint manager (what `fit()` saves and resumes from)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow


def test_a_checkpoint_saved_by_verl_restores_the_actors_weights(tiny_model_path: Path, tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from agl_train.attention import resolve_attn_implementation
    from agl_train.config import compose_config
    from agl_train.cpu_workers import LocalWorkerGroup, use_cpu
    from agl_train.verl_loss import register_per_rollout_loss
    from examples.lowercase_words.train import overrides

    register_per_rollout_loss()
    config = compose_config(overrides(tiny_model_path, "http://127.0.0.1:9", steps=2, out=tmp_path))
    OmegaConf.resolve(config)
    resolve_attn_implementation(config)  # as the trainer's constructor does: sdpa without flash-attn
    use_cpu()
    actor = LocalWorkerGroup(config.actor_rollout_ref, role="actor")
    saved = {name: tensor.clone() for name, tensor in actor.model.state_dict().items()}
    path = str(tmp_path / "global_step_1" / "actor")

    actor.save_checkpoint(path, None, 1, max_ckpt_to_keep=None)
    with torch.no_grad():
        for parameter in actor.model.parameters():
            parameter.add_(1.0)
    actor.load_checkpoint(path, del_local_after_load=False)

    restored = actor.model.state_dict()
    assert all(torch.equal(saved[name], restored[name]) for name in saved)
    assert sorted(name for name, _ in actor.per_tensor_params()) == sorted(saved)  # what the weight sync sends
