"""Old module paths of agl_train, before its split into `core`, `algo`, `runner`, `verl_glue`.

`import agl_train.entry` (or `python -m agl_train.entry`) fails with a message naming the new
path instead of a bare "No module named" (`agl_store.moved_modules`).
"""

from __future__ import annotations

from types import MappingProxyType

from agl_store import moved_modules

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


def install() -> None:
    """Make the old paths fail naming the new ones (the package's `__init__` calls it)."""
    moved_modules.install(MOVED)
