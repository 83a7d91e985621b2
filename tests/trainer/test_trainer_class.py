"""`AglTrainer` is built like verl's `RayPPOTrainer` (no Ray needed to construct it)."""

from __future__ import annotations

import pytest

from agl_train.dataset import InMemoryDataset, collate_inputs
from agl_train.settings import compose_config

# torchdata's StatefulDataLoader (built by verl's constructor) warns about its own use of a
# deprecated torch call; that is library noise, not something this test checks.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

TASKS = [{"question": f"q{i}"} for i in range(6)]


def build(tokenizer, overrides):
    from agl_train.trainer import AglTrainer  # first: it imports verl with its import-time warnings silenced
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager, Role

    config = compose_config(["data.train_batch_size=2", "data.dataloader_num_workers=0", "trainer.total_epochs=1", *overrides])
    pool = ResourcePoolManager(resource_pool_spec={"global_pool": [1]}, mapping={Role.ActorRollout: "global_pool"})
    return AglTrainer(
        config=config,
        tokenizer=tokenizer,
        role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=pool,
        train_dataset=InMemoryDataset(TASKS),
        val_dataset=InMemoryDataset(TASKS[:2]),
        collate_fn=collate_inputs,
    )


def test_the_trainer_reads_batches_of_tasks_and_its_gateway_is_lazy(tokenizer) -> None:
    trainer = build(tokenizer, ["agentlightning.agl_base_url=http://127.0.0.1:9/", "agentlightning.agl_key=k"])

    assert trainer.total_training_steps == 3
    batch = next(iter(trainer.train_dataloader))
    assert len(batch["input"]) == 2 and all(task in TASKS for task in batch["input"])
    assert trainer._gateway is None
    assert (trainer.gateway.base_url, trainer.gateway.key, trainer.gateway.timeout_s) == ("http://127.0.0.1:9", "k", 300.0)


def test_an_async_batch_not_larger_than_the_train_batch_is_refused_by_the_constructor(tokenizer) -> None:
    with pytest.raises(ValueError, match="strictly greater than data.train_batch_size"):
        build(tokenizer, ["agentlightning.async_rollout.enabled=true", "agentlightning.async_rollout.async_train_batch_size=2"])
    trainer = build(tokenizer, ["agentlightning.async_rollout.enabled=true", "agentlightning.async_rollout.async_train_batch_size=3"])
    assert trainer.runner_settings.groups_in_flight == 3


def test_kl_in_the_reward_is_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        build(tokenizer, ["algorithm.use_kl_in_reward=true"])
