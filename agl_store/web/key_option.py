"""A bearer key on the command line: the option every `agl ... serve` command spells the same way."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyOption:
    """A bearer key given as `--NAME KEY`, `--NAME-file PATH` or the environment variable `env`.

    The flag is visible in the process list; the file and the variable are not.
    """

    flag: str
    """`--key`, `--admin-key`, ..."""
    env: str
    help: str

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_mutually_exclusive_group()
        group.add_argument(self.flag, dest=self.dest, metavar="KEY", help=f"{self.help} (default: ${self.env})")
        group.add_argument(
            self.flag + "-file", dest=self.dest + "_file", metavar="PATH", help=f"read {self.flag} from a file"
        )

    def read(self, args: argparse.Namespace) -> tuple[str | None, str]:
        """(the key or None, where it came from); ValueError for an unreadable or empty file."""
        given = getattr(args, self.dest)
        if given:
            return given, self.flag
        path = getattr(args, self.dest + "_file")
        if path:
            try:
                key = Path(path).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(f"{self.flag}-file {path}: {exc.strerror or exc}") from exc
            if not key:
                raise ValueError(f"{self.flag}-file {path} is empty")
            return key, f"{self.flag}-file"
        key = os.environ.get(self.env, "").strip()
        return (key, f"${self.env}") if key else (None, "")
