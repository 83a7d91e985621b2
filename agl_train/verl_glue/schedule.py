"""The trainer's step schedule: which batches each step draws, when it saves and validates.

verl's loop trains one dataloader batch per step. agl's async rollout keeps more groups in
flight (`async_train_batch_size`, G) than a step trains (`data.train_batch_size`, T), so the
first step needs more than one batch, and at the end the groups still in flight must be trained
by steps that draw nothing new. `StepSchedule` is that arithmetic, pure, so the loop, the
checkpoint and the resume agree. With B batches per epoch and E epochs (B·E·T prompts), step s
(1-based) trains T groups, and before it collects the groups submitted so far are

    submitted(s) = min((s − 1)·T + G, B·E·T)        (G = T without async rollout)

so ceil(submitted(s) / T) batches have been drawn. The run ends at

    last_step = min(trainer.total_training_steps, B·E)

where, when the data ends first, every prompt drawn has been trained and nothing is left in
flight. A run that `total_training_steps` ends earlier leaves G − T groups in flight (and up to
T − 1 prompts drawn but not submitted); the trainer cancels and reports them.

After step s the prompts drawn but not trained (in flight, or waiting to be submitted) number
ceil(submitted(s) / T)·T − s·T; a checkpoint keeps them, and a resume submits them first and
continues with the dataloader at batch `batches_drawn(s)` (`resume_position`). That arithmetic
holds only under the schedule the checkpoint was saved with: the checkpoint records B, T and G
(`resume_key`), and a resume under other values is refused (`check_resume`), since the groups it
carried and the dataloader's position would no longer match what the steps expect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import trainer_settings

RESUME_KEYS = {
    "batches_per_epoch": "the dataset size over data.train_batch_size",
    "batch_size": "data.train_batch_size",
    "groups_in_flight": "agentlightning.async_rollout (async_train_batch_size, or one batch when off)",
}
"""The schedule parameters a resume must keep, with the settings they come from."""


@dataclass(frozen=True)
class StepPlan:
    """What step `step` does besides training.

    `draw`: new batches to take from the dataloader before it collects; `in_flight`: groups to
    have in flight when it collects (submit pending prompts up to it); `epoch`: the epoch of
    the newest batch drawn; `save` / `validate`: checkpoint / validate after the update.
    """

    step: int
    draw: int
    in_flight: int
    epoch: int
    is_last: bool
    save: bool
    validate: bool


@dataclass(frozen=True)
class StepSchedule:
    """The schedule of one run (see the module docstring); `save_freq` / `test_freq` as verl's
    `trainer.save_freq` / `trainer.test_freq` (≤ 0: never, else every k steps and the last)."""

    batches_per_epoch: int
    total_epochs: int
    total_training_steps: int
    batch_size: int
    groups_in_flight: int
    save_freq: int = -1
    test_freq: int = -1

    def __post_init__(self) -> None:
        for name in ("batches_per_epoch", "total_epochs", "total_training_steps", "batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.groups_in_flight < self.batch_size:
            raise ValueError(
                f"groups_in_flight ({self.groups_in_flight}) must be at least batch_size ({self.batch_size})"
            )

    @property
    def total_batches(self) -> int:
        return self.batches_per_epoch * self.total_epochs

    @property
    def last_step(self) -> int:
        return min(self.total_training_steps, self.total_batches)

    def submitted(self, step: int) -> int:
        """Groups submitted once step `step` collects (0 before the first step)."""
        if step <= 0:
            return 0
        return min((step - 1) * self.batch_size + self.groups_in_flight, self.total_batches * self.batch_size)

    def batches_drawn(self, step: int) -> int:
        """Batches drawn from the dataloader once step `step` collects, and still after it."""
        return -(-self.submitted(step) // self.batch_size)

    def carried(self, step: int) -> int:
        """Prompts drawn but not trained after step `step`: in flight or waiting to be submitted."""
        return self.batches_drawn(step) * self.batch_size - step * self.batch_size

    def plan(self, step: int) -> StepPlan:
        if not 1 <= step <= self.last_step:
            raise ValueError(f"step must be in 1..{self.last_step}, got {step}")
        is_last = step == self.last_step
        drawn = self.batches_drawn(step)
        return StepPlan(
            step=step,
            draw=drawn - self.batches_drawn(step - 1),
            in_flight=self.submitted(step) - (step - 1) * self.batch_size,
            epoch=(drawn - 1) // self.batches_per_epoch,
            is_last=is_last,
            save=self.save_freq > 0 and (is_last or step % self.save_freq == 0),
            validate=self.test_freq > 0 and (is_last or step % self.test_freq == 0),
        )

    def resume_position(self, completed_steps: int) -> tuple[int, int]:
        """(epoch, batches already drawn in it) after `completed_steps` steps."""
        return divmod(self.batches_drawn(completed_steps), self.batches_per_epoch)

    def resume_key(self) -> dict[str, int]:
        """What a checkpoint records of this schedule (`RESUME_KEYS`)."""
        return {name: int(getattr(self, name)) for name in RESUME_KEYS}

    def check_resume(self, saved: Mapping[str, Any]) -> None:
        """ValueError naming each parameter of `RESUME_KEYS` that differs from the checkpoint's
        `saved` ones (a checkpoint without them, from before they were recorded, passes)."""
        changed = [
            f"{name} {saved[name]} → {value} ({RESUME_KEYS[name]})"
            for name, value in self.resume_key().items()
            if name in saved and saved[name] != value
        ]
        if changed:
            raise ValueError(
                "this resume changes the step schedule its checkpoint was saved with: "
                + "; ".join(changed)
                + ". The groups the checkpoint carried and the dataloader's position only fit that schedule: "
                "resume with the same settings, or start a new run"
            )


def schedule_for(config: Any, batches_per_epoch: int, total_training_steps: int | None = None) -> StepSchedule:
    """The schedule of a trainer config (`trainer`, `data`, `agentlightning` keys) with
    `batches_per_epoch` dataloader batches per epoch, as `AglTrainer.fit()` runs it;
    `total_training_steps` defaults to `trainer.total_training_steps` (verl computes it when null)."""
    agl, runner = trainer_settings(config)
    trainer = config.trainer
    return StepSchedule(
        batches_per_epoch=batches_per_epoch,
        total_epochs=int(trainer.total_epochs),
        total_training_steps=int(
            trainer.total_training_steps if total_training_steps is None else total_training_steps
        ),
        batch_size=agl.train_batch_size,
        groups_in_flight=runner.groups_in_flight,
        save_freq=int(trainer.save_freq),
        test_freq=int(trainer.test_freq),
    )


__all__ = ["RESUME_KEYS", "StepPlan", "StepSchedule", "schedule_for"]
