"""Tasks of a run file: a JSON-lines file, a Parquet file, a list written in the file itself, or
`package.module:function` returning the list (imported from the run file's folder or the current one)."""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import RunFileError


def read_tasks(source: Any, field: str, where: str, base: Path) -> list[dict[str, Any]]:
    """The tasks `source` names (a path relative to `base`, or a list of mappings); each a dict.
    RunFileError names `where` (the run file) and `field`."""
    if isinstance(source, str) and FUNCTION.match(source) and not (base / source).exists():
        tasks = _call(source, field, where, base)
    elif isinstance(source, str):
        tasks = _read_file(base / source, field, where)
    elif isinstance(source, list):
        tasks = source
    else:
        raise RunFileError(
            where, field, f"a JSONL or Parquet path, module:function or a list of tasks, got {type(source).__name__}"
        )
    if not tasks:
        raise RunFileError(where, field, "no tasks")
    for number, task in enumerate(tasks, start=1):
        if not isinstance(task, Mapping):
            raise RunFileError(where, field, f"task {number} is not a mapping of fields: {task!r}")
    return [dict(task) for task in tasks]


FUNCTION = re.compile(r"^[\w.]+:\w+$")


def _call(spec: str, field: str, where: str, base: Path) -> Any:
    """Import and call `spec` from the run file's folder or the current one, as the agent imports."""
    module_name, _, name = spec.partition(":")
    folders = [str(base), str(Path.cwd())]
    sys.path[:0] = folders
    try:
        function = getattr(importlib.import_module(module_name), name)
        return function()
    except (ImportError, AttributeError) as exc:
        raise RunFileError(where, field, f"{spec!r}: {exc}") from None
    finally:
        del sys.path[: len(folders)]


def _read_file(path: Path, field: str, where: str) -> list[Any]:
    if not path.is_file():
        raise RunFileError(where, field, f"no file {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows: list[Any] = pq.read_table(path).to_pylist()
        return rows
    tasks = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise RunFileError(where, field, f"{path}:{number} is not JSON: {exc}") from None
    return tasks
