"""User hooks: `agentlightning.hooks` names a module with a `RolloutHooks` class.

```python
# my_project/hooks.py
class RolloutHooks:
    def on_startup(self) -> None:
        start_my_sandbox_pool()

    def on_batch(self, step: int, batch) -> None:
        log_rows(step, batch.non_tensor_batch["rollout_id"], batch.batch["advantages"])
```
`on_startup()` runs once when `fit()` starts, before the first rollout. `on_batch(step, batch)`
runs every step that updates the actor, just before `update_actor`, with the step's update batch
(verl's `DataProto`: the rows after the advantage, the update cap and the per-rollout
normalisation, plus the old log-probs): a place to log or check what the actor trains on. The
batch is the one the update uses, so a hook that changes it changes the update. Both are optional.
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


def run_batch_hook(hooks: Any | None, step: int, batch: Any) -> None:
    """`hooks.on_batch(step, batch)` when the hooks have one."""
    on_batch = getattr(hooks, "on_batch", None)
    if on_batch is not None:
        on_batch(step, batch)
