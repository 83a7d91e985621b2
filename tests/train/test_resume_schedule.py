"""A checkpoint records the run's id and its step schedule; a resume under another schedule is
refused with a message naming what changed (the carried groups and the dataloader position fit
only the schedule they were saved under)."""

from __future__ import annotations

import json

import pytest

from agl_train.verl_glue.schedule import StepSchedule
from agl_train.verl_glue.trainer import CARRIED_FILE

from .test_trainer_class import ASYNC, WorkerGroup, build, run_steps

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def test_a_resume_that_changes_the_async_settings_is_refused(tokenizer, tmp_path) -> None:
    saved = [*ASYNC, f"trainer.default_local_dir={tmp_path}", "data.shuffle=false"]
    first = build(tokenizer, saved)
    first.actor_rollout_wg, first.global_steps = WorkerGroup(), 0
    run_steps(first, 2)
    first._save_checkpoint()
    carried = json.loads((tmp_path / "global_step_2" / CARRIED_FILE).read_text())
    assert carried["run_id"] == first.identity.run_id
    assert carried["schedule"] == {"batches_per_epoch": 3, "batch_size": 2, "groups_in_flight": 3}

    same = build(tokenizer, saved)
    same.actor_rollout_wg, same.global_steps = WorkerGroup(), 0
    same._load_checkpoint()
    assert same.identity.run_id == first.identity.run_id and same.identity.launch_id != first.identity.launch_id

    synchronous = build(tokenizer, [f"trainer.default_local_dir={tmp_path}", "data.shuffle=false"])
    synchronous.actor_rollout_wg, synchronous.global_steps = WorkerGroup(), 0
    with pytest.raises(ValueError, match=r"groups_in_flight 3 → 2 \(agentlightning.async_rollout"):
        synchronous._load_checkpoint()


def test_an_old_checkpoint_without_a_schedule_resumes() -> None:
    schedule = StepSchedule(
        batches_per_epoch=3, total_epochs=1, total_training_steps=3, batch_size=2, groups_in_flight=2
    )
    schedule.check_resume({})
    schedule.check_resume(schedule.resume_key())
    with pytest.raises(ValueError, match="batch_size 4 → 2"):
        schedule.check_resume({**schedule.resume_key(), "batch_size": 4})
