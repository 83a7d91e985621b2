"""User hooks: `agentlightning.hooks` names a module with a `RolloutHooks` class.

```python
# my_project/hooks.py
class RolloutHooks:
    def on_startup(self) -> None:
        start_my_sandbox_pool()
```
`on_startup()` runs once when the trainer starts, before the first rollout.
"""

from __future__ import annotations

import importlib
from typing import Any

HOOKS_CLASS = "RolloutHooks"


def load_hooks(module_path: str | None) -> Any | None:
    """An instance of `module_path`'s `RolloutHooks`, or None when no module is configured."""
    if not module_path:
        return None
    module = importlib.import_module(module_path)
    hooks_class = getattr(module, HOOKS_CLASS, None)
    if hooks_class is None:
        raise ValueError(f"hooks module {module_path!r} has no class {HOOKS_CLASS!r}")
    return hooks_class()


def run_startup_hooks(module_path: str | None) -> Any | None:
    """Load the hooks and call `on_startup()` (when the class has one); returns the instance."""
    hooks = load_hooks(module_path)
    on_startup = getattr(hooks, "on_startup", None)
    if on_startup is not None:
        on_startup()
    return hooks
