"""`AglTrainer` is built like verl's `RayPPOTrainer` (no Ray needed to construct it)."""

from __future__ import annotations

import pytest
import torch

from agl_train.verl_glue.config import compose_config
from agl_train.verl_glue.dataset import InMemoryDataset, collate_inputs
from agl_train.verl_glue.trainer import (
    AglTrainer,  # before any verl import: it imports verl with its import warnings silenced
)

# torchdata's StatefulDataLoader (built by verl's constructor) warns about its own use of a
# deprecated torch call; that is library noise, not something this test checks.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

TASKS = [{"question": f"q{i}"} for i in range(6)]


def build(tokenizer, overrides):
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager, Role

    config = compose_config(
        ["data.train_batch_size=2", "data.dataloader_num_workers=0", "trainer.total_epochs=1", *overrides]
    )
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


def test_the_trainer_reads_batches_of_tasks_and_its_proxy_control_is_lazy(tokenizer) -> None:
    trainer = build(tokenizer, ["agentlightning.agl_base_url=http://127.0.0.1:9/", "agentlightning.agl_key=k"])

    assert trainer.total_training_steps == 3
    batch = next(iter(trainer.train_dataloader))
    assert len(batch["input"]) == 2 and all(task in TASKS for task in batch["input"])
    assert trainer._proxy is None
    assert (trainer.proxy.base_url, trainer.proxy.key, trainer.proxy.timeout_s) == ("http://127.0.0.1:9", "k", 300.0)


def test_an_async_batch_not_larger_than_the_train_batch_is_refused_by_the_constructor(tokenizer) -> None:
    with pytest.raises(ValueError, match="strictly greater than data.train_batch_size"):
        build(
            tokenizer,
            ["agentlightning.async_rollout.enabled=true", "agentlightning.async_rollout.async_train_batch_size=2"],
        )
    trainer = build(
        tokenizer,
        ["agentlightning.async_rollout.enabled=true", "agentlightning.async_rollout.async_train_batch_size=3"],
    )
    assert trainer.runner_settings.groups_in_flight == 3


def test_a_drain_bound_that_is_not_positive_is_refused(tokenizer) -> None:
    assert build(tokenizer, []).drain_timeout_s == 60.0  # config.yaml's default
    with pytest.raises(ValueError, match="agentlightning.update_drain_timeout_seconds must be a positive number"):
        build(tokenizer, ["agentlightning.update_drain_timeout_seconds=0"])


def test_what_an_update_does_with_the_calls_in_flight_is_one_of_three(tokenizer) -> None:
    assert build(tokenizer, []).update_in_flight == "continue"  # config.yaml's default
    assert build(tokenizer, ["agentlightning.update_in_flight=drain"]).update_in_flight == "drain"
    with pytest.raises(ValueError, match="agentlightning.update_in_flight must be one of continue, drain, cancel"):
        build(tokenizer, ["agentlightning.update_in_flight=wait"])


def test_kl_in_the_reward_is_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        build(tokenizer, ["algorithm.use_kl_in_reward=true"])


def test_the_constructor_refuses_a_critic_config_before_verl_builds_anything(tokenizer) -> None:
    with pytest.raises(ValueError, match=r"algorithm.adv_estimator=gae .*set algorithm.adv_estimator=grpo"):
        build(tokenizer, ["algorithm.adv_estimator=gae"])
    with pytest.raises(ValueError, match=r"trainer.critic_warmup=1 .*set trainer.critic_warmup=0"):
        build(tokenizer, ["trainer.critic_warmup=1"])
    with pytest.raises(ValueError, match=r"algorithm.rollout_correction.bypass_mode=true"):
        build(tokenizer, ["algorithm.rollout_correction.bypass_mode=true"])


def test_the_constructor_takes_verls_rollout_correction_and_refuses_what_verl_would_refuse(tokenizer) -> None:
    build(tokenizer, ["algorithm.rollout_correction.rollout_is=token", "agentlightning.max_token_staleness=2"])
    with pytest.raises(ValueError, match=r"algorithm.rollout_correction is not one verl can apply: .*rollout_rs"):
        build(tokenizer, ["algorithm.rollout_correction.rollout_rs=token_k3"])  # no threshold
    with pytest.raises(ValueError, match=r"agentlightning.max_token_staleness must be .*>= 0"):
        build(tokenizer, ["agentlightning.max_token_staleness=-1"])


def test_the_attention_is_left_to_the_workers(tokenizer) -> None:
    # Each worker resolves `auto` where it loads the model (agl_train.verl_glue.workers.AglWorker), not the driver.
    trainer = build(tokenizer, [])
    assert trainer.config.actor_rollout_ref.model.override_config.attn_implementation == "auto"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["reward.reward_model.enable=true"],
            "reward.reward_model.enable=true: .*set reward.reward_model.enable=false",
        ),
        (
            ["actor_rollout_ref.model.lora_rank=8"],
            "lora_rank=8 without actor_rollout_ref.model.lora.merge=true: .* base weights",
        ),
        (["actor_rollout_ref.model.lora.rank=8"], "set actor_rollout_ref.model.lora.merge=true"),
        (
            ["trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.use_kl_loss=true"],
            "use_kl_loss=true needs verl's reference model, which cannot be sharded on the CPU",
        ),
    ],
)
def test_what_the_workers_would_build_and_never_use_is_refused_with_the_key(tokenizer, overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        build(tokenizer, overrides)
    build(tokenizer, ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora.merge=true"])


# --- the update half of a step, with verl's own batch code ----------------------------------


class WorkerGroup:
    """Stands in for the actor's Ray worker group where a step only needs its shape (two
    data-parallel ranks) and its checkpoint calls, which it records."""

    def __init__(self, calls=None):
        self._dispatch_info = {"actor": [0, 1]}
        self.calls = calls if calls is not None else []

    def save_checkpoint(self, local_path, *args, **kwargs):
        self.calls.append("save_checkpoint")

    def load_checkpoint(self, local_path, *args, **kwargs):
        self.calls.append("load_checkpoint")


def update_batch(tokenizer):
    """Four rows of different lengths, two groups, as the step's data path hands them to the update."""
    import random

    from agl_train.core.aggregate import Limits
    from agl_train.verl_glue.step import build_batch, prepare_update

    from .builders import call, trace, train_settings

    traces = [
        trace(f"ro-{i}", [call([1, 2, 3], [5] * (1 + 3 * i))], reward_value=float(i % 2), uid=f"g{i // 2}")
        for i in range(4)
    ]
    settings = train_settings(limits=Limits(8, 16))
    data, _ = build_batch(traces, settings, tokenizer.pad_token_id)
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    data, _ = prepare_update(data, settings, rng=random.Random(0), adv_estimator="grpo")
    return data


def test_balance_batch_reorders_rows_across_data_parallel_ranks_as_verl_does(tokenizer) -> None:
    trainer = build(tokenizer, [])
    trainer.actor_rollout_wg = WorkerGroup()
    batch, metrics = update_batch(tokenizer), {}
    before = batch.non_tensor_batch["rollout_id"].tolist()

    trainer._prepare_batch(batch, metrics)

    after = batch.non_tensor_batch["rollout_id"].tolist()
    assert sorted(after) == sorted(before) and after != before
    tokens = batch.batch["attention_mask"].sum(-1).tolist()
    assert sum(tokens[:2]) == sum(tokens[2:])  # each rank gets the same number of tokens here
    assert batch.meta_info["global_token_num"] == tokens
    assert "global_seqlen/balanced_max" in metrics

    unbalanced = build(tokenizer, ["trainer.balance_batch=false"])
    batch, metrics = update_batch(tokenizer), {}
    unbalanced._prepare_batch(batch, metrics)
    assert batch.non_tensor_batch["rollout_id"].tolist() == before and metrics == {}


def test_rollout_data_dir_gets_each_steps_rows(tokenizer, tmp_path) -> None:
    import json

    trainer = build(tokenizer, [f"trainer.rollout_data_dir={tmp_path}"])
    trainer.global_steps = 3
    batch = update_batch(tokenizer)

    trainer._dump_rollouts(batch, {})
    trainer._shutdown_dump_executor()

    rows = [json.loads(line) for line in (tmp_path / "3.jsonl").read_text().splitlines()]
    assert [row["rollout_id"] for row in rows] == [f"ro-{i}" for i in range(4)]
    assert [row["score"] for row in rows] == [0.0, 1.0, 0.0, 1.0] and all(row["step"] == 3 for row in rows)


@pytest.mark.parametrize("cancelled", [0, 2])
def test_the_checkpoint_is_saved_while_the_replicas_sleep_before_update_weights(
    tokenizer, monkeypatch, cancelled: int
) -> None:
    from verl import DataProto

    import agl_train.verl_glue.trainer as trainer_module
    from agl_train.runner.groups import Collected
    from agl_train.verl_glue.step import StepData

    calls = []
    trainer = build(tokenizer, ["trainer.balance_batch=false"])
    trainer.actor_rollout_wg = WorkerGroup(calls)
    batch = update_batch(tokenizer)

    async def rollouts(new_inputs):
        calls.append("rollouts")
        return StepData(data=batch, metrics={}, collected=Collected(groups=[], counts={}, carried_over=0))

    async def pause(proxy, drain_timeout_s, hold_s, in_flight):
        calls.append(f"pause (drain {drain_timeout_s:g} s, hold {hold_s:g} s, {in_flight})")
        return {"rollout/proxy_calls_cancelled_at_update": float(cancelled)}

    async def publish():
        calls.append("publish")
        return "rs-1"

    class Proxy:
        async def resume(self):
            calls.append("resume")

    class CheckpointManager:
        def abort_replicas(self):
            calls.append("abort_replicas")

        def resume_generation_replicas(self):
            calls.append("resume_generation_replicas")

        def sleep_replicas(self):
            calls.append("sleep_replicas")

        def update_weights(self, step):
            calls.append("update_weights")

    def old_log_prob(data):
        calls.append("old_log_prob")
        zeros = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        return DataProto.from_dict({"old_log_probs": zeros}), 0.0

    def update_actor(data):
        calls.append("update_actor")
        return DataProto(meta_info={"metrics": {"actor/pg_loss": [0.0]}})

    monkeypatch.setattr(trainer_module, "pause_for_update", pause)
    monkeypatch.setattr(trainer, "_rollouts", rollouts)
    monkeypatch.setattr(trainer, "_publish_replicas", publish)
    monkeypatch.setattr(trainer, "_compute_old_log_prob", old_log_prob)
    monkeypatch.setattr(trainer, "_update_actor", update_actor)
    monkeypatch.setattr(trainer, "_save_checkpoint", lambda: calls.append("save_checkpoint"))
    trainer._proxy, trainer.checkpoint_manager, trainer.global_steps = Proxy(), CheckpointManager(), 1
    trainer._loop.start()
    try:
        trainer._train_step([{"question": "q"}], save=True)
    finally:
        trainer._loop.stop()

    # Calls the drain cut may still run on the engine: aborted before it sleeps, resumed once it has new weights.
    aborted = ["abort_replicas"] if cancelled else []
    assert calls == [
        "rollouts",
        "pause (drain 60 s, hold 3600 s, continue)",  # held calls outlast the update and the checkpoint
        *aborted,
        "sleep_replicas",
        "old_log_prob",
        "update_actor",
        "save_checkpoint",
        "update_weights",
        *(["resume_generation_replicas"] if cancelled else []),
        "publish",  # the new weight version, before the calls held during the update go
        "resume",
    ]


# --- checkpoint and resume of the step schedule ------------------------------------------------

ASYNC = ["agentlightning.async_rollout.enabled=true", "agentlightning.async_rollout.async_train_batch_size=3"]


def run_steps(trainer, until):
    """fit()'s data side from the trainer's current step to `until`: draw as the schedule says;
    the groups complete in submission order, so a step trains the first 2 prompts in line."""
    schedule = trainer._schedule()
    batches = trainer._batches(schedule.resume_position(trainer.global_steps)[0])
    trained = []
    for step in range(trainer.global_steps + 1, until + 1):
        plan = schedule.plan(step)
        trainer.global_steps = step
        for _ in range(plan.draw):
            trainer._pending += next(batches, [])
        trained.append(trainer._pending[:2])
        trainer._pending = trainer._pending[2:]
    return trained


@pytest.mark.parametrize("rollout, saved_at", [(ASYNC, 2), (ASYNC, 3), (ASYNC, 4), ([], 2), ([], 4)])
def test_a_resumed_run_trains_the_same_prompts_as_one_that_never_stopped(
    tokenizer, tmp_path, rollout, saved_at
) -> None:
    overrides = [*rollout, f"trainer.default_local_dir={tmp_path}", "data.shuffle=false", "trainer.total_epochs=2"]
    whole = build(tokenizer, overrides)
    whole.global_steps = 0
    assert whole._schedule().last_step == 6  # 3 batches × 2 epochs (async: the groups in flight drained at the end)
    expected = run_steps(whole, 6)
    assert sorted(q["question"] for pair in expected for q in pair) == sorted(2 * [t["question"] for t in TASKS])

    first = build(tokenizer, overrides)
    first.actor_rollout_wg, first.global_steps = WorkerGroup(), 0
    before = run_steps(first, saved_at)
    first._save_checkpoint()

    resumed = build(tokenizer, overrides)
    resumed.actor_rollout_wg = WorkerGroup()
    resumed.global_steps = 0
    resumed._load_checkpoint()
    assert resumed.global_steps == saved_at and resumed._pending == first._pending
    assert before + run_steps(resumed, 6) == expected


async def test_groups_left_in_flight_by_the_last_step_are_cancelled_and_reported(tokenizer, tmp_path, caplog) -> None:
    from agl_store.sqlite import SQLiteStore
    from agl_train.runner.groups import GroupTracker

    trainer = build(tokenizer, [*ASYNC, "trainer.total_training_steps=1"])
    trainer.global_steps = 1
    store = await SQLiteStore(str(tmp_path / "agl.db")).open()
    try:
        trainer._tracker = GroupTracker(store, 1)
        groups = await trainer._tracker.submit([{"question": "late"}])
        trainer._pending = [{"question": "never submitted"}]

        with caplog.at_level("WARNING", logger="agl_train.verl_glue.trainer"):
            metrics = await trainer._cancel_leftovers()

        assert metrics == {"rollout/n_groups_cancelled_at_end": 1.0, "rollout/n_prompts_not_trained": 1.0}
        assert (await store.get_rollout_by_id(groups[0].rollout_ids[0])).status == "cancelled"
        assert trainer._tracker.in_flight == [] and trainer._pending == []
        assert "1 groups in flight cancelled and 1 drawn prompts not submitted" in caplog.text
    finally:
        await store.close()


@pytest.mark.vllm
async def test_a_trajectory_run_gives_the_proxy_each_training_row_s_budget(tokenizer, vllm_server, tmp_path) -> None:
    from agl_proxy.server.proxy import LLMProxy
    from agl_store.sqlite import SQLiteStore
    from agl_train.verl_glue.cpu_workers import ExternalReplicas

    store = await SQLiteStore(str(tmp_path / "agl.db")).open()
    proxy = LLMProxy(model_list=[], store=store, port=0, key="sekret", hold_s=0)
    await proxy.start()
    address = vllm_server.base_url.removeprefix("http://").removesuffix("/v1")  # as verl reports it
    trainers = []
    try:
        for level in ("trajectory", "transition"):
            trainer = build(
                tokenizer,
                [
                    f"agentlightning.agl_base_url={proxy.url}",
                    "agentlightning.agl_key=sekret",
                    f"agentlightning.trace_aggregator.level={level}",
                    "actor_rollout_ref.rollout.response_length=512",
                ],
            )
            trainers.append(trainer)
            trainer._store = store
            trainer.llm_server_manager = ExternalReplicas([address])
            resources_id = await trainer._publish_replicas()

            actor = trainer.sampling_by_mode()
            registered = proxy.state.sampling.state()["by_mode"]
            # Each call still capped at rollout.response_length; in a trajectory run a training call also
            # gets no more than its row still holds (trajectory_max_response_length, config.yaml's 8192).
            budget = {"row_tokens": 8192} if level == "trajectory" else {}
            assert registered == {"train": {**actor["train"], **budget}, "val": actor["val"]}
            assert actor["train"]["max_tokens"] == actor["val"]["max_tokens"] == 512
            # Agents are given the actor's sampling: the budget is the proxy's, not a request field.
            resources = await store.get_resources_by_id(resources_id)
            assert resources.resources["main_llm"].sampling_parameters == actor["train"]
    finally:
        for trainer in trainers:
            await trainer.proxy.aclose()
        await proxy.stop()
        await store.close()
