"""Old module paths that fail naming their new ones, for packages whose layout changed.

`import agl_proxy.token_chain` (or `python -m agl_train.entry`) then fails with a message naming
the new path instead of a bare "No module named". A package's `__init__` installs one finder
with its own table; the finder is consulted last, only for names no other finder found, so it
costs nothing on a working import. agl_proxy uses it (agl_train has its own: importing it must
not import agl_store).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Raises ModuleNotFoundError naming the new path of a module in `moved` (old name → new name)."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = moved

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = self.moved.get(fullname)
        if new is None:
            return None
        raise ModuleNotFoundError(f"{fullname} moved to {new}: import it from there", name=fullname)


def install(moved: Mapping[str, str]) -> None:
    """Append a finder for `moved` to `sys.meta_path`, once per table."""
    if not any(isinstance(finder, MovedModuleFinder) and finder.moved is moved for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder(moved))
