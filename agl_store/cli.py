"""The `agl` command line.

Subcommand groups are plug-ins: each entry point of the `agl.commands` group names a function
that receives the top-level argparse subparsers and adds its group to them (`agl_proxy` adds
`agl proxy ...`), so this module knows only its own `agl store ...` commands. Only the group
the user typed is imported: `agl store serve` runs without the proxy's or the trainer's
dependencies, and a group that fails to import fails with its error and what to install.
`agl --help` lists the groups by their entry-point names without importing them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, requires
from typing import Any

from .data_commands import add_data_commands
from .errors import StoreError
from .opening import db_url
from .server import DEFAULT_MAX_BODY_BYTES, PAGE_SETTING_HELP, create_app, parse_page_settings
from .web.key_option import KeyOption
from .web.serving import serve_app

ENTRY_POINT_GROUP = "agl.commands"
DEFAULT_PORT = 4747
DISTRIBUTION = "agl"
AddCommands = Callable[[Any], None]
"""What an `agl.commands` entry point names: called with the top-level subparsers."""


class CommandGroupError(Exception):
    """A command group's plug-in failed to import; the message says what to install."""


STORE_KEY = KeyOption("--key", "AGL_STORE_KEY", "require 'Authorization: Bearer KEY' (health checks stay open)")


def add_store_commands(subparsers: Any) -> None:
    """Add `agl store serve`, `stats`, `export` and `expire` to the top-level subparsers."""
    store = subparsers.add_parser("store", help="the LightningStore (rollouts, spans, resources)")
    commands = store.add_subparsers(dest="store_command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="serve a store over HTTP")
    serve.add_argument("--db", default="agl.db", help="SQLite file path or store URL: sqlite:///PATH, memory://")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    STORE_KEY.add_to(serve)
    serve.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    serve.add_argument("--page-setting", action="append", default=[], metavar="NAME.KEY=VALUE", help=PAGE_SETTING_HELP)
    serve.set_defaults(run=_serve)
    add_data_commands(commands)


def _plugins() -> dict[str, EntryPoint]:
    """The `agl.commands` entry points by group name, not loaded (`store` is built in, not one of them)."""
    return {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}


def load_command_group(entry: EntryPoint) -> AddCommands:
    """Import one group's plug-in; CommandGroupError names the missing package and the extra that provides it."""
    try:
        return entry.load()
    except ImportError as exc:
        raise CommandGroupError(f"agl {entry.name}: cannot import {entry.value}: {exc}{_install_hint(exc)}") from exc


def _install_hint(exc: ImportError) -> str:
    """`; install it with: pip install 'agl[EXTRA]'` when an extra of agl requires the missing module."""
    missing = (exc.name or "").split(".")[0]
    if not missing:
        return ""
    try:
        requirements = requires(DISTRIBUTION) or []
    except PackageNotFoundError:
        return ""
    for requirement in requirements:
        name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
        if extra and name.replace("-", "_").lower() == missing.lower():
            return f"; install it with: pip install '{DISTRIBUTION}[{extra.group(1)}]'"
    return ""


def _parser() -> tuple[argparse.ArgumentParser, Any]:
    parser = argparse.ArgumentParser(prog="agl", description="agl: train LLM agents with RL without rewriting them")
    subparsers = parser.add_subparsers(dest="group", required=True, metavar="GROUP")
    add_store_commands(subparsers)
    return parser, subparsers


def build_parser(group: str | None = None, plugins: dict[str, EntryPoint] | None = None) -> argparse.ArgumentParser:
    """The `agl` parser with the store commands and the plug-in `group`, or every plug-in when None;
    `plugins` as `_plugins()` found them (found here when None).

    Raises CommandGroupError when a plug-in it loads fails to import.
    """
    parser, subparsers = _parser()
    for name, entry in (_plugins() if plugins is None else plugins).items():
        if group is None or name == group:
            load_command_group(entry)(subparsers)
    return parser


def _listing_parser(plugins: dict[str, EntryPoint]) -> argparse.ArgumentParser:
    """A parser that lists every group for `--help` and usage errors, importing none of the plug-ins."""
    parser, subparsers = _parser()
    for name, entry in plugins.items():
        subparsers.add_parser(name, help=f"plug-in {entry.module}; `agl {name} --help` says more")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `agl` script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    plugins = _plugins()
    group = next((arg for arg in argv if not arg.startswith("-")), None)
    if group is None or (group != "store" and group not in plugins):
        _listing_parser(plugins).parse_args(argv)  # prints help or a usage error and exits
        return 2
    try:
        parser = build_parser(group, plugins)
    except CommandGroupError as exc:
        print(exc, file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
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
        page_settings = parse_page_settings(args.page_setting)
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
    auth = f"bearer key required (from {key_source})" if key else "no key"
    try:
        try:
            app = create_app(
                store, key=key, max_body_bytes=args.max_body_bytes, page_settings=page_settings, host=args.host
            )
        except ValueError as exc:  # a pages plug-in refused its settings
            print(f"agl store serve: {exc}", file=sys.stderr)
            return 2
        return await serve_app(
            app, name="agl store serve", host=args.host, port=args.port, describe=f"store {url}, {auth}"
        )
    finally:
        await store.close()  # idempotent; covers a server that never ran its lifespan


if __name__ == "__main__":
    # Run the imported module's main, so its functions are the ones entry points name.
    from agl_store.cli import main as _main

    sys.exit(_main())
