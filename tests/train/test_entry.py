"""`run_ppo`'s input checks, the in-memory dataset, and how Ray starts."""

from __future__ import annotations

import pytest

from agl_train.verl_glue.config import compose_config
from agl_train.verl_glue.dataset import InMemoryDataset, check_dataset, collate_inputs
from agl_train.verl_glue.entry import ray_init_kwargs, run_ppo

TASKS = [{"question": "1+1", "answer": "2"}, {"question": "2*3", "answer": "6"}, {"question": "9-4", "answer": "5"}]


@pytest.fixture(scope="module")
def config():
    return compose_config(["data.train_batch_size=2"])


@pytest.mark.parametrize(
    "train, error, message",
    [
        ([], ValueError, "train_dataset is empty"),
        ((), ValueError, "train_dataset is empty"),
        (None, TypeError, "in-memory sequence"),
        ({"question": "q"}, TypeError, "got dict"),
        ("questions.jsonl", TypeError, "got str"),
        ((t for t in TASKS), TypeError, "got generator"),
        ([{"question": object()}], ValueError, r"train_dataset\[0\] is not a JSON-like object"),
    ],
)
def test_run_ppo_refuses_bad_datasets_before_starting_anything(config, train, error, message) -> None:
    with pytest.raises(error, match=message):
        run_ppo(config, train, TASKS)


def test_run_ppo_checks_the_validation_set_and_the_settings_too(config) -> None:
    with pytest.raises(ValueError, match="val_dataset is empty"):
        run_ppo(config, TASKS, [])
    bad = compose_config(
        [
            "agentlightning.async_rollout.enabled=true",
            "agentlightning.async_rollout.async_train_batch_size=2",
            "data.train_batch_size=2",
        ]
    )
    with pytest.raises(ValueError, match="async_train_batch_size"):
        run_ppo(bad, TASKS, TASKS)


def test_the_dataset_hands_out_tasks_untouched_in_batches() -> None:
    from torch.utils.data import DataLoader

    dataset = InMemoryDataset(TASKS)
    batches = list(DataLoader(dataset, batch_size=2, collate_fn=collate_inputs, shuffle=False))

    assert len(dataset) == 3 and dataset[1] == {"input": TASKS[1]}
    assert batches == [{"input": TASKS[:2]}, {"input": TASKS[2:]}]
    assert check_dataset("d", (1, "two", [3])) == [1, "two", [3]]


def test_verl_samples_from_it(config) -> None:
    from verl.trainer.ppo.utils import create_rl_sampler

    sampler = create_rl_sampler(config.data, InMemoryDataset(TASKS))
    assert sorted(sampler) == [0, 1, 2]


def test_ray_starts_with_verl_runtime_env(config) -> None:
    kwargs = ray_init_kwargs(config)
    assert kwargs["runtime_env"]["env_vars"]["VLLM_LOGGING_LEVEL"] == "WARN"  # verl's, kept
    assert "num_cpus" not in kwargs  # Ray counts the machine's


def test_on_the_cpu_ray_gets_a_cpu_per_worker_and_the_vllm_servers_must_be_given() -> None:
    cpu = compose_config(["data.train_batch_size=2", "trainer.device=cpu", "trainer.n_gpus_per_node=2"])
    assert ray_init_kwargs(cpu)["num_cpus"] == 3  # two workers and the trainer's actor
    with pytest.raises(
        ValueError, match=r"trainer.device=cpu: .*rollout=agl_train.verl_glue.cpu_workers.ExternalRollout"
    ):
        run_ppo(cpu, TASKS, TASKS)
