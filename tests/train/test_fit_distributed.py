"""`AglTrainer.fit()` through verl's distributed path on the CPU: `run_ppo` on a local Ray cluster,
verl's `RayWorkerGroup` of two `AglWorker` processes in a CPU resource pool, FSDP2 sharding the actor
over gloo, the weights gathered from the shards to the tiny vLLM (its own, in dev mode), a sharded
checkpoint saved and resumed. The lowercase-words task (examples/lowercase_words), two steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.lowercase_words.train import Run, train

pytestmark = [
    pytest.mark.slow,
    pytest.mark.training,
    pytest.mark.vllm,
    # torchdata's StatefulDataLoader (built by verl's constructor) warns about its own use of a deprecated torch call.
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

STEPS = 2
WORKERS = 2
ROLLOUTS_PER_STEP = 16  # data.train_batch_size 4 × rollout.n 4
LOGPROB_TOLERANCE = 1e-3  # as tests/train/test_fit_cpu.py


class Runs:
    def __init__(self, trained: Run, trained_dir: Path, resumed: Run, resumed_dir: Path) -> None:
        self.trained, self.trained_dir, self.resumed, self.resumed_dir = trained, trained_dir, resumed, resumed_dir


@pytest.fixture(scope="module")
def runs(dev_vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Two steps saving a checkpoint at the last (Ray started by `run_ppo`), then a second run
    resuming from it on a Ray cluster started beforehand (with no step left to train, it only
    loads the checkpoint and syncs the weights to vLLM)."""
    import ray

    address = dev_vllm_server.root_url.removeprefix("http://")
    trained_dir, resumed_dir = tmp_path_factory.mktemp("trained"), tmp_path_factory.mktemp("resumed")
    checkpoint = trained_dir / "checkpoints" / f"global_step_{STEPS}"
    try:
        trained = train(
            dev_vllm_server.model_path, address, trained_dir, STEPS, print_lines=False, workers=WORKERS,
            extra=[f"trainer.save_freq={STEPS}", "trainer.val_before_train=false", "trainer.test_freq=-1"],
        )  # fmt: skip
        ray.shutdown()  # verl's resource pools outlive the run in its cluster: resume in a fresh one
        # Started here, not by agl (as `ray start` or a job submission would): agl's loss, attention
        # choice and CPU platform still reach the workers, which set them up themselves.
        logger_path = {"VERL_FILE_LOGGER_PATH": str(resumed_dir / "metrics.jsonl")}  # what train() sets for its run
        ray.init(num_cpus=WORKERS + 1, num_gpus=0, include_dashboard=False, runtime_env={"env_vars": logger_path})
        resumed = train(
            dev_vllm_server.model_path, address, resumed_dir, STEPS, print_lines=False, workers=WORKERS,
            extra=["trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}",
                   "trainer.val_before_train=false"],
        )  # fmt: skip
    finally:
        ray.shutdown()
    return Runs(trained, trained_dir, resumed, resumed_dir)


def test_two_ray_workers_train_every_step_with_verls_actor_update(runs: Runs) -> None:
    run = runs.trained
    assert run.world_size == WORKERS
    assert [int(m["step"]) for m in run.history] == list(range(1, STEPS + 1))
    for metrics in run.history:
        assert (metrics["rollout/n_done"], metrics["rollout/n_failed"]) == (ROLLOUTS_PER_STEP, 0)
        assert metrics["training/n_update_rows"] == ROLLOUTS_PER_STEP
        assert "actor/pg_loss" in metrics and metrics["rollout/proxy_drained"] == 1.0
    assert any(metrics["actor/grad_norm"] > 0 for metrics in run.history)


def test_the_actors_parameters_are_sharded_across_the_two_workers(runs: Runs) -> None:
    (local_0, full_0), (local_1, full_1) = runs.trained.param_numel
    assert full_0 == full_1 == local_0 + local_1
    assert 0 < local_0 < full_0 and 0 < local_1 < full_1
    # verl's FSDP checkpoint: one shard file per rank.
    actor = runs.trained_dir / "checkpoints" / f"global_step_{STEPS}" / "actor"
    assert sorted(path.name for path in actor.glob("model_world_size_*")) == [
        f"model_world_size_{WORKERS}_rank_{rank}.pt" for rank in range(WORKERS)
    ]


def test_vllm_samples_from_the_weights_gathered_from_the_shards(runs: Runs) -> None:
    # vLLM's logprobs of the sampled tokens against the sharded actor's old log-probs, each step.
    diffs = [metrics["training/rollout_probs_diff_max"] for metrics in runs.trained.history]
    assert max(diffs) < LOGPROB_TOLERANCE, diffs


def test_a_resumed_run_loads_the_sharded_checkpoint(runs: Runs) -> None:
    from safetensors.torch import load_file

    # Each run's last sync wrote the weights it gathered from its shards: after training, and after resuming.
    trained = load_file(runs.trained_dir / "weights" / f"step_{STEPS}" / "model.safetensors")
    resumed = load_file(runs.resumed_dir / "weights" / f"step_{STEPS}" / "model.safetensors")
    assert runs.resumed.world_size == WORKERS and runs.resumed.history == []
    assert trained.keys() == resumed.keys()
    assert all(bool((trained[name] == resumed[name]).all()) for name in trained)
