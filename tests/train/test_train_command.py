"""`agl train CONFIG` (agl_train/command/): each check before anything starts, each warning while training,
and one step end to end on the CPU with an agent that is none of the examples (tests/train/caps/)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from agl_train.command.composed import CPU_DEFAULTS, compose_run_config
from agl_train.command.errors import RunFileError
from agl_train.command.preflight import check_one_rollout
from agl_train.command.run_file import load_run_file
from agl_train.command.step_warnings import NO_SIGNAL_STEPS, StepWarnings
from agl_train.command.steps import StepPrinter, format_step
from agl_train.command.tasks import read_tasks
from agl_train.runner.function_agent import AGENT_CLASS as FUNCTION_AGENT
from agl_train.runner.function_agent import FunctionAgent

CAPS_AGENT = "tests.train.caps.agent:CapsAgent"
TASKS = [{"text": "hello world"}, {"text": "Some Capitals"}]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A folder that passes for a model before anything loads it."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def write_run(tmp_path: Path, model: Path, /, **keys: Any) -> Path:
    """A run file in `tmp_path`: the caps agent, two tasks, `model`, then `keys` (None removes a key)."""
    run: dict[str, Any] = {"agent": CAPS_AGENT, "tasks": TASKS, "model": str(model), "env_map": {"TEXT": "input.text"}}
    run.update(keys)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in run.items() if v is not None}))
    return path


def test_a_mistyped_agent_class_names_the_file_the_field_and_the_attribute(tmp_path: Path, model: Path) -> None:
    path = write_run(tmp_path, model, agent="tests.train.caps.agent:CapAgent")
    with pytest.raises(RunFileError, match=r"run\.yaml: agent: .*has no attribute 'CapAgent'") as caught:
        load_run_file(path)
    assert (caught.value.where, caught.value.field) == (str(path), "agent")


def test_an_agent_module_that_does_not_import_is_named(tmp_path: Path, model: Path) -> None:
    with pytest.raises(RunFileError, match=r"agent: 'caps_agentt:CapsAgent' does not import .*No module named"):
        load_run_file(write_run(tmp_path, model, agent="caps_agentt:CapsAgent"))


def test_an_agent_beside_the_run_file_imports_from_its_folder(tmp_path: Path, model: Path) -> None:
    (tmp_path / "my_agent.py").write_text("class MyAgent:\n    def run(self):\n        return 1.0\n")
    run = load_run_file(write_run(tmp_path, model, agent="my_agent:MyAgent"))
    assert run.agent_class == "my_agent:MyAgent" and run.agent_env()["PYTHONPATH"].startswith(str(tmp_path))


def test_a_function_agent_runs_through_the_function_agent_class(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = load_run_file(write_run(tmp_path, model, agent="tests.train.caps.functions:upper_share"))
    assert (run.agent_class, run.agent_function) == (FUNCTION_AGENT, "tests.train.caps.functions:upper_share")
    for name, value in {**run.agent_env(), "AGL_INPUT": json.dumps({"text": "AB"})}.items():
        monkeypatch.setenv(name, value)
    assert FunctionAgent().run() == 1.0


def test_an_env_map_field_missing_from_a_task_names_the_variable_and_the_task(tmp_path: Path, model: Path) -> None:
    tasks = [{"text": "a"}, {"txt": "b"}]
    with pytest.raises(RunFileError, match=r"run\.yaml: env_map\.TEXT: tasks: task 2: .*no field 'input\.text'"):
        load_run_file(write_run(tmp_path, model, tasks=tasks))
    with pytest.raises(RunFileError, match=r"env_map\.TEXT: val_tasks: task 1"):
        load_run_file(write_run(tmp_path, model, val_tasks=[{"other": 1}]))


def test_the_required_keys_are_named_and_unknown_ones_refused(tmp_path: Path, model: Path) -> None:
    with pytest.raises(RunFileError, match=r"run\.yaml: tasks, model: required \(the required keys: agent, tasks"):
        load_run_file(write_run(tmp_path, model, tasks=None, model=None))
    with pytest.raises(RunFileError, match=r"run\.yaml: lr: unknown key; agl and verl keys go under `config:`"):
        load_run_file(write_run(tmp_path, model, lr=0.1))
    with pytest.raises(RunFileError, match=r"run\.yaml: model: .* is not a Hugging Face model folder"):
        load_run_file(write_run(tmp_path, model, model=str(tmp_path)))


def test_tasks_come_from_jsonl_parquet_or_a_list(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    pq.write_table(pa.Table.from_pylist(TASKS), tmp_path / "tasks.parquet")
    for source in ("tasks.jsonl", "tasks.parquet", TASKS):
        assert read_tasks(source, "tasks", "run.yaml", tmp_path) == TASKS
    with pytest.raises(RunFileError, match=r"run\.yaml: tasks: no file"):
        read_tasks("missing.jsonl", "tasks", "run.yaml", tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"text": 1}\nnot json\n')
    with pytest.raises(RunFileError, match=r"bad\.jsonl:2 is not JSON"):
        read_tasks("bad.jsonl", "tasks", "run.yaml", tmp_path)


def test_the_config_composes_with_the_cpu_defaults_apart(tmp_path: Path, model: Path) -> None:
    run = load_run_file(write_run(tmp_path, model, config={"actor_rollout_ref": {"actor": {"optim": {"lr": 0.03}}}}))
    cpu = compose_run_config(run, model, "http://proxy", cpu=True)
    assert cpu.actor_rollout_ref.actor.optim.lr == 0.03 and cpu.agentlightning.local.agent_class == CAPS_AGENT
    assert dict(cpu.agentlightning.local.env_map) == {"TEXT": "input.text"}
    assert list(cpu.trainer.logger) == CPU_DEFAULTS["trainer.logger"]
    assert OmegaConf.is_missing(cpu.actor_rollout_ref.rollout, "name")  # the CPU path starts vLLM itself
    gpu = compose_run_config(run, model, "http://proxy", cpu=False)
    assert gpu.actor_rollout_ref.rollout.name == "vllm"
    assert list(gpu.trainer.logger) != CPU_DEFAULTS["trainer.logger"]


def test_a_config_key_neither_agl_nor_verl_has_is_named(tmp_path: Path, model: Path) -> None:
    run = load_run_file(write_run(tmp_path, model, config={"actor_rollout_ref.actor.optim.lrr": 0.1}))
    with pytest.raises(RunFileError, match=r"run\.yaml: config\.actor_rollout_ref\.actor\.optim\.lrr: neither"):
        compose_run_config(run, model, "http://proxy", cpu=True)


def test_a_micro_batch_that_does_not_divide_the_mini_batch_is_named(tmp_path: Path, model: Path) -> None:
    run = load_run_file(write_run(tmp_path, model, config={"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 3}))
    with pytest.raises(
        RunFileError,
        match=r"config\.actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu: 3 does not divide .* 8 rows",
    ):
        compose_run_config(run, model, "http://proxy", cpu=True)


def test_agls_own_setting_errors_name_the_file(tmp_path: Path, model: Path) -> None:
    run = load_run_file(write_run(tmp_path, model, config={"agentlightning.trace_aggregator.level": "steps"}))
    with pytest.raises(RunFileError, match=r"run\.yaml: config: unknown trace_aggregator level 'steps'"):
        compose_run_config(run, model, "http://proxy", cpu=True)


def test_one_rollout_before_training_quotes_the_agents_error(tmp_path: Path, model: Path) -> None:
    run = load_run_file(write_run(tmp_path, model, agent="tests.train.caps.functions:broken"))
    with pytest.raises(RunFileError, match=r"(?s)agent: one rollout of task 1 failed .*the agent cannot read task"):
        check_one_rollout(run, "http://127.0.0.1:9/v1", "model")
    working = load_run_file(write_run(tmp_path, model, agent="tests.train.caps.functions:upper_share"))
    assert check_one_rollout(working, "http://127.0.0.1:9/v1", "model") == 0.0


def step(number: int, **metrics: float) -> dict[str, float]:
    defaults = {"rollout/n_done": 16.0, "rollout/reward_min": 0.0, "rollout/reward_max": 1.0, "training/n_rows": 16.0}
    return {"step": float(number), "training/global_step": float(number), "training/n_update_rows": 16.0} | (
        defaults | metrics
    )


def test_equal_rewards_in_every_group_for_several_steps_warn_of_no_learning_signal() -> None:
    warn = StepWarnings()
    flat = {"rollout/reward_min": 0.0, "rollout/reward_max": 0.0, "rollout/reward_mean": 0.0}
    found = [warn(step(n, **flat)) for n in range(1, NO_SIGNAL_STEPS + 1)]
    assert found[:-1] == [[]] * (NO_SIGNAL_STEPS - 1) and "no learning signal" in found[-1][0]
    # Different rewards across groups but none within one: zero advantages, the same verdict.
    zero_advantages = {"critic/advantages/max": 0.0, "critic/advantages/min": 0.0}
    assert warn(step(9, **zero_advantages)) and not StepWarnings()(step(1))


def test_a_large_rollout_probs_diff_names_grammar_constrained_sampling() -> None:
    (warning,) = StepWarnings()(step(1, **{"training/rollout_probs_diff_max": 0.99999}))
    assert "is 0.99999 " in warning and "forced `tool_choice`" in warning
    assert StepWarnings()(step(1, **{"training/rollout_probs_diff_max": 0.01})) == []


def test_most_rows_dropped_warns() -> None:
    (warning,) = StepWarnings()(step(1, **{"training/n_update_rows": 3.0}))
    assert warning.startswith("most rows dropped: 3 of 16 rows trained")


def test_failed_rollouts_quote_the_first_failure_once() -> None:
    warn = StepWarnings(lambda: "Traceback ...\nValueError: module 'caps_agent' has no attribute 'CapAgent'")
    (first,) = warn(step(1, **{"rollout/n_failed": 3.0, "rollout/n_done": 13.0}))
    assert first.startswith("3 of 16 rollouts failed") and "has no attribute 'CapAgent'" in first
    (second,) = warn(step(2, **{"rollout/n_failed": 1.0}))
    assert "first failure" not in second


def test_the_first_failure_is_read_from_the_store(tmp_path: Path) -> None:
    from agl_store.sqlite import SQLiteStore
    from agl_train.command.run_store import first_failure
    from agl_train.runner.outcome import RolloutOutcome, record_outcome

    async def fail_one_rollout() -> None:
        async with SQLiteStore(str(db)) as store:
            attempted = await store.start_rollout(input={"text": "a"})
            await record_outcome(
                store, RolloutOutcome(attempted.rollout_id, attempted.attempt.attempt_id, "failed", message="boom")
            )

    db = tmp_path / "agl.db"
    assert first_failure(db) is None
    asyncio.run(fail_one_rollout())
    assert first_failure(db) == "boom"


def test_the_step_printer_prints_a_line_and_the_steps_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    calls = {"training/n_llm_calls/bridged": 1.0, "training/n_llm_calls/rendered": 3.0}
    record = step(1, **{"rollout/reward_mean": 0.5, "rollout/n_failed": 2.0, "actor/grad_norm": 0.25, **calls})
    record["timing_s/step"] = 12.5
    with StepPrinter(metrics, warn=StepWarnings()) as printer, open(metrics, "a") as log:
        for line in ({"step": 0, "data": {"val/reward_mean": 0.25}}, {"step": 1, "data": record}):
            log.write(json.dumps(line) + "\n")
            log.flush()
    out = capsys.readouterr().out
    assert format_step(record) in out and "0.500 (0.00..1.00)" in out and "25%" in out and "2.50e-01" in out
    assert "step 1: warning: 2 of 18 rollouts failed" in out and "   0  val reward 0.250" in out
    assert len(printer.history) == 1 and len(printer.validations) == 1 and len(printer.warnings) == 1


def test_agl_train_check_reports_a_broken_file_with_exit_code_2(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agl_store.cli import main

    assert main(["train", "--check", str(write_run(tmp_path, model, steps=0))]) == 2
    assert "agl train: " + str(tmp_path / "run.yaml") + ": steps: a positive number" in capsys.readouterr().err
    assert main(["train", "--check", str(write_run(tmp_path, model))]) == 0


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.vllm
# torchdata's StatefulDataLoader (built by verl's constructor) warns about its own use of a deprecated torch call.
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_agl_train_trains_the_caps_agent_for_a_step_on_the_cpu(real_vocab_model_path: Path, tmp_path: Path) -> None:
    from agl_train.command.train import train

    run_file = Path(__file__).parent / "caps" / "train.yaml"
    config = yaml.safe_load(run_file.read_text()) | {"model": str(real_vocab_model_path), "agent": CAPS_AGENT}
    config["tasks"] = str(run_file.parent / config["tasks"])
    config["config"] |= {"data.train_batch_size": 2}  # 2 tasks × rollout.n 4: one mini-batch
    result = train(config, out=tmp_path / "run", steps=1, check_rollout=True, print_lines=False)
    assert [int(m["step"]) for m in result.history] == [1]
    assert result.history[0]["rollout/n_done"] == 8 and result.history[0]["training/n_update_rows"] > 0
    assert result.model is not None and (result.model / "config.json").is_file()
    assert (result.model / "model.safetensors").stat().st_size > 1_000_000
    assert result.curve is not None and result.curve.is_file()
    assert os.environ.get("VERL_FILE_LOGGER_PATH") is None  # the run's environment is gone again
