"""The `max_ppo_update_times` drop policy (docs/training.md).

verl updates the actor once per mini-batch of `ppo_mini_batch_size × rollout.n` rows, and
the aggregator may produce many more rows than prompts. The batch therefore keeps whole
mini-batches only:

    kept = M · min(⌊B / M⌋, max_ppo_update_times)    (no cap when max_ppo_update_times is None)

with B the rows and M the mini-batch size. The B − kept rows to drop are taken first, at
random, from groups (same `uid`) whose rewards are all equal — under a group-relative
advantage they carry none — and only then at random from the other rows.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

METRIC_DROPPED_SAME_REWARD = "training/n_sample_dropped/same_reward"
METRIC_DROPPED_RANDOM = "training/n_sample_dropped/random"


@dataclass(frozen=True)
class UpdateCap:
    """Rows kept (indices, ascending) and how many were dropped from each pool."""

    keep: list[int]
    n_dropped_same_reward: int
    n_dropped_random: int

    @property
    def metrics(self) -> dict[str, float]:
        return {
            METRIC_DROPPED_SAME_REWARD: self.n_dropped_same_reward,
            METRIC_DROPPED_RANDOM: self.n_dropped_random,
        }


def mini_batch_rows(ppo_mini_batch_size: int, rollout_n: int) -> int:
    """M = ppo_mini_batch_size × rollout.n: rows per PPO update."""
    if ppo_mini_batch_size <= 0 or rollout_n <= 0:
        raise ValueError(f"ppo_mini_batch_size and rollout.n must be positive, got {ppo_mini_batch_size}, {rollout_n}")
    return ppo_mini_batch_size * rollout_n


def kept_row_count(n_rows: int, mini_batch_size: int, max_ppo_update_times: int | None) -> int:
    """M · min(⌊B / M⌋, cap); the cap is ignored when None."""
    n_updates = n_rows // mini_batch_size
    if max_ppo_update_times is not None:
        if max_ppo_update_times <= 0:
            raise ValueError(f"max_ppo_update_times must be positive or null, got {max_ppo_update_times}")
        n_updates = min(n_updates, max_ppo_update_times)
    return n_updates * mini_batch_size


def same_reward_rows(uids: Sequence[str], rewards: Sequence[float]) -> list[bool]:
    """For each row, whether every row of its group (same uid) has the same reward."""
    first: dict[str, float] = {}
    varying: set[str] = set()
    for uid, reward in zip(uids, rewards, strict=False):
        if uid not in first:
            first[uid] = reward
        elif reward != first[uid]:
            varying.add(uid)
    return [uid not in varying for uid in uids]


def cap_updates(
    uids: Sequence[str],
    rewards: Sequence[float],
    *,
    ppo_mini_batch_size: int,
    rollout_n: int,
    max_ppo_update_times: int | None,
    rng: random.Random,
) -> UpdateCap:
    """Choose the rows of the update batch (see the module docstring for the policy)."""
    if len(uids) != len(rewards):
        raise ValueError("uids and rewards must have one entry per row")
    n_rows = len(uids)
    n_drop = n_rows - kept_row_count(n_rows, mini_batch_rows(ppo_mini_batch_size, rollout_n), max_ppo_update_times)
    same = same_reward_rows(uids, rewards)
    same_pool = [i for i in range(n_rows) if same[i]]
    other_pool = [i for i in range(n_rows) if not same[i]]
    from_same = rng.sample(same_pool, min(n_drop, len(same_pool)))
    from_other = rng.sample(other_pool, n_drop - len(from_same))
    dropped = set(from_same) | set(from_other)
    return UpdateCap(
        keep=[i for i in range(n_rows) if i not in dropped],
        n_dropped_same_reward=len(from_same),
        n_dropped_random=len(from_other),
    )
