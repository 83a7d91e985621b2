"""`agentlightning.hooks`: a module whose RolloutHooks().on_startup() runs when the trainer starts."""

from __future__ import annotations

import os

import pytest

from agl_train.verl_glue.hooks import load_hooks, run_batch_hook, run_startup_hooks


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


def test_on_batch_gets_the_step_and_the_batch_and_is_optional() -> None:
    seen = []

    class Hooks:
        def on_batch(self, step: int, batch: object) -> None:
            seen.append((step, batch))

    batch = object()
    run_batch_hook(Hooks(), 3, batch)
    run_batch_hook(load_hooks("tests.train.hooks_example"), 4, batch)  # a class without on_batch
    run_batch_hook(None, 5, batch)
    assert seen == [(3, batch)]
