"""The error of a run file: which file, which field, what is wrong."""

from __future__ import annotations


class RunFileError(ValueError):
    """A run file that cannot train; the message is `FILE: FIELD: what is wrong`."""

    def __init__(self, where: str, field: str, problem: str) -> None:
        super().__init__(f"{where}: {field}: {problem}")
        self.where = where
        self.field = field
