"""The `agl` command line.

Subcommand groups are plugins: each entry point of the `agl.commands` group is a function
that adds its parsers to the top-level subparsers (`agl_proxy` adds `agl proxy ...`), so
this module knows only its own `agl store ...` commands.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

from .errors import StoreError
from .server import DEFAULT_MAX_BODY_BYTES, create_app
from .web.serving import serve_app

ENTRY_POINT_GROUP = "agl.commands"
DEFAULT_PORT = 4747
AddCommands = Callable[[Any], None]


def db_url(db: str) -> str:
    """`--db` as a store URL: URLs pass through, a plain path becomes `sqlite:///path`."""
    if "://" in db:
        return db
    return f"sqlite:///{db}"


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

    def read(self, args: argparse.Namespace) -> tuple[Optional[str], str]:
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


STORE_KEY = KeyOption("--key", "AGL_STORE_KEY", "require 'Authorization: Bearer KEY' (health checks stay open)")


def add_store_commands(subparsers: Any) -> None:
    """Add `agl store serve` to the top-level subparsers."""
    store = subparsers.add_parser("store", help="the LightningStore (rollouts, spans, resources)")
    commands = store.add_subparsers(dest="store_command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="serve a store over HTTP")
    serve.add_argument("--db", default="agl.db", help="SQLite file path or store URL: sqlite:///PATH, memory://")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    STORE_KEY.add_to(serve)
    serve.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    serve.set_defaults(run=_serve)


def _command_groups() -> List[AddCommands]:
    groups: List[AddCommands] = [add_store_commands]
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            add = entry.load()
        except Exception as exc:
            print(f"agl: skipping command group {entry.name!r}: {exc}", file=sys.stderr)
            continue
        if add not in groups:
            groups.append(add)
    return groups


def build_parser() -> argparse.ArgumentParser:
    """The `agl` parser with every discovered command group."""
    parser = argparse.ArgumentParser(prog="agl", description="agl: train LLM agents with RL without rewriting them")
    subparsers = parser.add_subparsers(dest="group", required=True, metavar="GROUP")
    for add in _command_groups():
        add(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `agl` script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = args.run(args)
    return int(result or 0)


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_serve_async(args))
    return uvloop.run(_serve_async(args))


async def _serve_async(args: argparse.Namespace) -> int:
    from .opening import open_store

    try:
        key, key_source = STORE_KEY.read(args)
    except ValueError as exc:
        print(f"agl store serve: {exc}", file=sys.stderr)
        return 2
    url = db_url(args.db)
    try:
        store = await open_store(url)
    except (StoreError, OSError) as exc:
        print(f"agl store serve: cannot open the store {url}: {exc}", file=sys.stderr)
        return 2
    # Opened here so a bad URL fails before the port is taken; the app's lifespan owns it
    # from then on (its open() is a no-op, its close() runs at shutdown).
    app = create_app(store, key=key, max_body_bytes=args.max_body_bytes, host=args.host)
    auth = f"bearer key required (from {key_source})" if key else "no key"
    try:
        return await serve_app(
            app, name="agl store serve", host=args.host, port=args.port, describe=f"store {url}, {auth}"
        )
    finally:
        await store.close()  # idempotent; covers a server that never ran its lifespan


if __name__ == "__main__":
    # Run the imported module's main, so its functions are the ones entry points name.
    from agl_store.cli import main as _main

    sys.exit(_main())
