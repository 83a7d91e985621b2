"""The agent launcher: load a class by name, run it, turn its return value into a reward."""

from __future__ import annotations

import pytest

from agl_train.runner.launch import load_agent_class, reward_payload, run_agent


def test_agent_classes_are_named_with_a_colon_or_a_dot() -> None:
    from tests.train.agents import AsyncAgent

    assert load_agent_class("tests.train.agents:AsyncAgent") is AsyncAgent
    assert load_agent_class("tests.train.agents.AsyncAgent") is AsyncAgent
    with pytest.raises(ValueError, match="has no attribute 'Nope'"):
        load_agent_class("tests.train.agents:Nope")


def test_rewards_are_numbers_dicts_or_none() -> None:
    assert reward_payload(1) == {"reward": 1.0}
    assert reward_payload({"reward": 0.5}) == {"reward": 0.5}
    assert reward_payload(None) == {"reward": None}
    for bad in ("1.0", float("nan"), True):
        with pytest.raises(TypeError):
            reward_payload(bad)


def test_a_coroutine_run_is_awaited() -> None:
    assert run_agent("tests.train.agents:AsyncAgent") == {"reward": 0.25}


def test_the_rollout_launcher_does_not_import_the_store() -> None:
    # One process starts per rollout: the launcher must not pay for the store's client and models.
    import subprocess
    import sys

    probe = "import sys, agl_train.runner.launch; print(sorted(m for m in sys.modules if m.startswith('agl_store')))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
