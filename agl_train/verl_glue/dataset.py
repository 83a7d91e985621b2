"""In-memory datasets: the `train_dataset` / `val_dataset` given to `run_ppo`.

Each element is one task, a JSON-like object that becomes a rollout's `input` unchanged. verl's
own `RLHFDataset` reads parquet files, tokenizes prompts and filters over-long ones; none of
that applies to agent tasks, so this dataset only hands out the objects it was given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from torch.utils.data import Dataset

INPUT_KEY = "input"


def check_dataset(name: str, dataset: Any) -> list[Any]:
    """`dataset` as a list, after checking it is a non-empty sequence of JSON-like objects.

    Raises TypeError for something that is not a sequence (a dict, a string, a generator)
    and ValueError for an empty one or an element that is not JSON-serialisable.
    """
    if dataset is None or isinstance(dataset, (str, bytes, Mapping)) or not isinstance(dataset, Sequence):
        raise TypeError(
            f"{name} must be an in-memory sequence (list or tuple) of task objects, got {type(dataset).__name__}"
        )
    if len(dataset) == 0:
        raise ValueError(f"{name} is empty: it needs at least one task")
    items = list(dataset)
    for index, item in enumerate(items):
        try:
            json.dumps(item)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{name}[{index}] is not a JSON-like object (it becomes a rollout's input): {exc}"
            ) from None
    return items


class InMemoryDataset(Dataset):
    """Tasks held in memory; `dataset[i]` is `{"input": task}` for verl's dataloader."""

    def __init__(self, tasks: Sequence[Any], name: str = "dataset") -> None:
        self.tasks = check_dataset(name, tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {INPUT_KEY: self.tasks[index]}


def collate_inputs(items: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """The dataloader's collate function: a batch is `{"input": [task, ...]}`, tasks untouched
    (verl's default collate would turn them into numpy arrays)."""
    return {INPUT_KEY: [item[INPUT_KEY] for item in items]}
