"""Agents written as functions for `agl train`'s tests: `module:function(task)` returning the reward."""

from __future__ import annotations

from typing import Any


def upper_share(task: dict[str, Any]) -> float:
    """A reward without a model call: the share of capitals in the task's text."""
    text = str(task["text"])
    return sum(c.isupper() for c in text) / max(len(text), 1)


def broken(task: dict[str, Any]) -> float:
    """An agent that fails before calling anything."""
    raise RuntimeError(f"the agent cannot read task {task!r}")
