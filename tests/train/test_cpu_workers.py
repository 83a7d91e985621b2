"""The CPU stand-in's actor without vLLM: verl's `ActorRolloutRefWorker` (as agl's `AglWorker`) in
this process, and its checkpoints through verl's own checkpoint manager (what `fit()` saves and
resumes from)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow


def test_a_checkpoint_saved_by_verl_restores_the_actors_weights(tiny_model_path: Path, tmp_path: Path) -> None:
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    from agl_train.verl_glue._verl import get_policy_loss_fn
    from agl_train.verl_glue.attention import flash_attn_installed
    from agl_train.verl_glue.config import compose_config
    from agl_train.verl_glue.cpu_run import LocalWorkerGroup
    from agl_train.verl_glue.verl_loss import compute_policy_loss_per_rollout_mean
    from examples.lowercase_words.train import overrides

    config = compose_config(overrides(tiny_model_path, "http://127.0.0.1:9", steps=2, out=tmp_path))
    OmegaConf.resolve(config)
    actor = LocalWorkerGroup(config.actor_rollout_ref, role="actor")
    # The worker set itself up: agl's loss registered, the attention chosen where it loads the model.
    assert get_policy_loss_fn("per_rollout_mean") is compute_policy_loss_per_rollout_mean
    attention = actor.worker.config.model.override_config.attn_implementation
    assert attention == ("flash_attention_2" if flash_attn_installed() else "sdpa")
    saved = {name: tensor.clone() for name, tensor in actor.model.state_dict().items()}
    path = str(tmp_path / "global_step_1" / "actor")

    actor.save_checkpoint(path, None, 1, max_ckpt_to_keep=None)
    with torch.no_grad():
        for parameter in actor.model.parameters():
            parameter.add_(1.0)
    actor.load_checkpoint(path, del_local_after_load=False)

    restored = actor.model.state_dict()
    assert all(torch.equal(saved[name], restored[name]) for name in saved)
    actor.save_rollout_weights(str(tmp_path / "weights"))  # what the weight sync sends
    sent = load_file(tmp_path / "weights" / "model.safetensors")
    assert sorted(sent) == sorted(saved) and all(torch.equal(sent[name], saved[name]) for name in saved)


def test_a_tied_weight_is_sent_once(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from agl_train.verl_glue.workers import weights_to_save

    embed = torch.nn.Embedding(8, 4)
    head = torch.nn.Linear(4, 8, bias=False)
    head.weight = embed.weight  # tie_word_embeddings, as Qwen2.5's small models have it
    params = [("model.embed_tokens.weight", embed.weight), ("lm_head.weight", head.weight)]

    tensors = weights_to_save(params)
    save_file(tensors, tmp_path / "model.safetensors")  # refused when the tied tensor comes twice
    assert list(load_file(tmp_path / "model.safetensors")) == ["model.embed_tokens.weight"]
    assert torch.equal(tensors["model.embed_tokens.weight"], embed.weight.detach())
