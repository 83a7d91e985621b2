"""The trainer's step schedule: batches per step, the last step, saves, validation, resume."""

from __future__ import annotations

import pytest

from agl_train.verl_glue.schedule import StepSchedule


def schedule(**changes) -> StepSchedule:
    values = dict(batches_per_epoch=5, total_epochs=2, total_training_steps=10, batch_size=4, groups_in_flight=4)
    return StepSchedule(**{**values, **changes})


def simulate(s: StepSchedule, start: int = 0, carried: int = 0):
    """Run the schedule as the trainer does, counting prompts: (prompts trained per step,
    prompts drawn, prompts left drawn but untrained at the end)."""
    trained, drawn, in_flight, pending = [], s.batches_drawn(start) * s.batch_size, 0, carried
    for step in range(start + 1, s.last_step + 1):
        plan = s.plan(step)
        pending += plan.draw * s.batch_size
        drawn += plan.draw * s.batch_size
        submit = min(pending, max(plan.in_flight - in_flight, 0))
        pending, in_flight = pending - submit, in_flight + submit
        assert in_flight >= s.batch_size, f"step {step} would wait for groups never submitted"
        trained.append(s.batch_size)
        in_flight -= s.batch_size
    return trained, drawn, in_flight + pending


def test_without_async_rollout_each_step_draws_one_batch_as_verl_does() -> None:
    s = schedule()
    plans = [s.plan(step) for step in range(1, s.last_step + 1)]
    assert [p.draw for p in plans] == [1] * 10
    assert [p.epoch for p in plans] == [0] * 5 + [1] * 5
    assert [p.is_last for p in plans] == [False] * 9 + [True]
    assert simulate(s) == ([4] * 10, 40, 0)


def test_async_rollout_reaches_the_last_step_and_trains_every_group_in_flight() -> None:
    # 6 groups in flight, 4 trained per step: step 1 draws two batches, the last step draws none.
    s = schedule(groups_in_flight=6)
    plans = [s.plan(step) for step in range(1, s.last_step + 1)]
    assert s.last_step == 10 == s.total_batches
    assert sum(p.draw for p in plans) == 10
    assert [p.draw for p in plans] == [2, 1, 1, 1, 1, 1, 1, 1, 1, 0]
    assert plans[0].in_flight == 6 and plans[-1].in_flight == 4  # the end drains the groups in flight
    assert plans[-1].is_last and plans[-1].epoch == 1
    assert simulate(s) == ([4] * 10, 40, 0)


@pytest.mark.parametrize("groups_in_flight", [5, 8, 9, 13])
def test_every_prompt_of_every_epoch_is_trained_whatever_the_async_batch(groups_in_flight) -> None:
    s = schedule(groups_in_flight=groups_in_flight, total_training_steps=100)
    assert s.last_step == 10
    trained, drawn, left = simulate(s)
    assert sum(trained) == drawn == 40 and left == 0


def test_a_shorter_run_ends_at_total_training_steps_and_reports_what_it_leaves() -> None:
    s = schedule(groups_in_flight=6, total_training_steps=3)
    assert s.last_step == 3 and s.plan(3).is_last
    trained, drawn, left = simulate(s)
    assert (sum(trained), drawn, left) == (12, 16, 4) == (12, 16, s.carried(3))


def test_checkpoints_and_validation_follow_verl_frequencies_and_always_fire_on_the_last_step() -> None:
    s = schedule(groups_in_flight=6, save_freq=4, test_freq=3)
    assert [p.step for p in map(s.plan, range(1, 11)) if p.save] == [4, 8, 10]
    assert [p.step for p in map(s.plan, range(1, 11)) if p.validate] == [3, 6, 9, 10]
    assert not any(schedule(save_freq=-1).plan(step).save for step in range(1, 11))


@pytest.mark.parametrize("groups_in_flight, completed", [(4, 3), (4, 5), (6, 3), (6, 4), (9, 7)])
def test_a_resumed_run_continues_where_the_checkpoint_left(groups_in_flight, completed) -> None:
    s = schedule(groups_in_flight=groups_in_flight)
    epoch, offset = s.resume_position(completed)
    assert epoch * s.batches_per_epoch + offset == s.batches_drawn(completed)
    # The resumed run draws the remaining batches, trains the carried prompts, and ends as one run would.
    trained, drawn, left = simulate(s, start=completed, carried=s.carried(completed))
    assert len(trained) == s.last_step - completed and left == 0
    assert drawn == s.total_batches * s.batch_size


def test_the_epoch_after_resume_is_not_zero() -> None:
    s = schedule()
    assert s.resume_position(7) == (1, 2)  # verl: global_steps // len(dataloader), then the loader skips 2


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"batches_per_epoch": 0}, "batches_per_epoch must be positive"),
        ({"total_training_steps": 0}, "total_training_steps must be positive"),
        ({"groups_in_flight": 3}, "at least batch_size"),
    ],
)
def test_impossible_schedules_are_refused(changes, message) -> None:
    with pytest.raises(ValueError, match=message):
        schedule(**changes)


def test_steps_outside_the_run_are_refused() -> None:
    with pytest.raises(ValueError, match=r"step must be in 1..10"):
        schedule().plan(11)
