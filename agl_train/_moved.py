"""Old module paths of agl_train, before its split into `core`, `algo`, `runner`, `verl_glue`.

`import agl_train.entry` (or `python -m agl_train.entry`) fails with a message naming the new
path instead of a bare "No module named". The finder is consulted last, only for names no
other finder found, so it costs nothing on a working import. It is this package's own, not
agl_store's `moved_modules` (agl_proxy's): `import agl_train` must not import agl_store, since
the rollout launcher (`agl_train.runner.launch`) starts one process per rollout.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import MappingProxyType, ModuleType

_PACKAGE_OF = {
    "core": ("traces", "aggregate", "prefix_break", "update_cap"),
    "algo": ("advantage", "loss", "tensorize"),
    "runner": ("proxy_control", "retention"),
    "verl_glue": (
        "_verl",
        "attention",
        "config",
        "cpu_workers",
        "dataset",
        "entry",
        "hooks",
        "schedule",
        "step",
        "trainer",
        "verl_batch",
        "verl_config",
        "verl_loss",
        "workers",
    ),
}
MOVED = MappingProxyType(
    {
        **{
            f"agl_train.{name}": f"agl_train.{package}.{name}"
            for package, names in _PACKAGE_OF.items()
            for name in names
        },
        "agl_train.cpu_workers": "agl_train.verl_glue.cpu_workers (run_ppo_on_cpu: agl_train.verl_glue.cpu_run)",
    }
)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Raises ModuleNotFoundError naming the new path of a module that moved."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        raise ModuleNotFoundError(f"{fullname} moved to {new}: import it from there", name=fullname)


def install() -> None:
    """Append the finder to `sys.meta_path` once (the package's `__init__` calls it)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
