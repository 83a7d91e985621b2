"""`agentlightning.hooks`: a module whose RolloutHooks().on_startup() runs when the trainer starts."""

from __future__ import annotations

import os

import pytest

from agl_train.hooks import load_hooks, run_startup_hooks


def test_on_startup_runs(monkeypatch) -> None:
    monkeypatch.delenv("AGL_TEST_HOOK_RAN", raising=False)
    hooks = run_startup_hooks("tests.train.hooks_example")

    assert type(hooks).__name__ == "RolloutHooks"
    assert os.environ["AGL_TEST_HOOK_RAN"] == "yes"


def test_no_hooks_configured_is_fine_and_a_module_without_the_class_is_an_error() -> None:
    assert run_startup_hooks(None) is None
    with pytest.raises(ValueError, match="has no class 'RolloutHooks'"):
        load_hooks("tests.train.agents")
    with pytest.raises(ModuleNotFoundError):
        load_hooks("tests.train.no_such_module")
