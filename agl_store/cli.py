"""The `agl` command line.

Subcommand groups are plugins: each entry point of the `agl.commands` group is a function
that adds its parsers to the top-level subparsers (`agl_proxy` adds `agl proxy ...`), so
this module knows only its own `agl store ...` commands.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from importlib.metadata import entry_points
from typing import Any, Callable, List, Optional, Sequence

from .errors import StoreError
from .server import DEFAULT_MAX_BODY_BYTES, create_app
from .serving import serve_app

ENTRY_POINT_GROUP = "agl.commands"
DEFAULT_PORT = 4747
AddCommands = Callable[[Any], None]


def db_url(db: str) -> str:
    """`--db` as a store URL: URLs pass through, a plain path becomes `sqlite:///path`."""
    if "://" in db:
        return db
    return f"sqlite:///{db}"


def add_store_commands(subparsers: Any) -> None:
    """Add `agl store serve` to the top-level subparsers."""
    store = subparsers.add_parser("store", help="the LightningStore (rollouts, spans, resources)")
    commands = store.add_subparsers(dest="store_command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="serve a store over HTTP")
    serve.add_argument("--db", default="agl.db", help="SQLite file path or store URL: sqlite:///PATH, memory://")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    serve.add_argument("--key", default=None, help="require 'Authorization: Bearer KEY' (health checks stay open)")
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
    from .urls import open_store

    url = db_url(args.db)
    try:
        store = await open_store(url)
    except (StoreError, OSError) as exc:
        print(f"agl store serve: cannot open the store {url}: {exc}", file=sys.stderr)
        return 2
    # Opened here so a bad URL fails before the port is taken; the app's lifespan owns it
    # from then on (its open() is a no-op, its close() runs at shutdown).
    app = create_app(store, key=args.key, max_body_bytes=args.max_body_bytes)
    auth = "bearer key required" if args.key else "no key"
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
