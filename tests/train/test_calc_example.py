"""The calculator example as a user copies it: its config loads and passes run_ppo's checks,
its dataset's answers are right, its calculator evaluates arithmetic and nothing else."""

from __future__ import annotations

import importlib.util

import pytest

from agl_train.verl_glue.entry import check_inputs
from examples.calc_agent.agent import CalcAgent, tool_result
from examples.calc_agent.calculator import calculate, final_number
from examples.calc_agent.dataset import train_tasks, val_tasks

from .conftest import REPO_ROOT


def load_train_module():
    spec = importlib.util.spec_from_file_location("calc_train", REPO_ROOT / "examples" / "calc_agent" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_config_is_a_valid_trainer_config() -> None:
    config = load_train_module().load_config(["data.train_batch_size=4"])

    check_inputs(config, train_tasks(), val_tasks())
    assert config.data.train_batch_size == 4
    assert config.agentlightning.local.agent_class == "examples.calc_agent.agent:CalcAgent"
    assert dict(config.agentlightning.local.env_map) == {"QUESTION": "input.question", "ANSWER": "input.answer"}
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "per_rollout_mean"  # agl's default kept


def test_the_dataset_answers_are_what_the_calculator_says() -> None:
    tasks = train_tasks()
    assert len(tasks) == 256 and tasks == train_tasks()  # deterministic
    for task in tasks[:20]:
        assert set(task) == {"question", "answer"} and float(task["answer"]).is_integer()


def test_the_calculator_tool_refuses_anything_but_arithmetic() -> None:
    assert calculate("(3 + 4) * 12 - 2 ** 3") == 76.0
    assert tool_result('{"expression": "7 / 2"}') == "3.5"
    assert tool_result('{"expression": "__import__(\\"os\\")"}').startswith("error")
    assert tool_result('{"expression": "9 ** 999"}').startswith("error")
    with pytest.raises(ValueError):
        calculate("open('x')")


def test_the_reward_is_an_exact_match_of_the_last_number(monkeypatch) -> None:
    monkeypatch.setenv("QUESTION", "What is 6 * 7?")
    monkeypatch.setenv("ANSWER", "42")
    monkeypatch.setenv("AGL_MODEL", "m")
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    agent = CalcAgent()
    assert (agent.reward("ANSWER: 42"), agent.reward("6 * 7 = 41"), agent.reward("no idea")) == (1.0, 0.0, 0.0)
    assert final_number("first 3, then -2.5") == -2.5
