"""Package attributes loaded from submodules on first use (PEP 562), for packages whose import
must stay cheap."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, List, Mapping, Tuple


def lazy_exports(package: str, exports: Mapping[str, str]) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """`__getattr__` and `__dir__` for `package`, where `exports` maps each public name to the
    submodule (relative to `package`) that defines it."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f".{module}", package), name)

    def __dir__() -> List[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
