"""The `agl` command line.

Subcommand groups are plugins: each entry point of the `agl.commands` group is a function
that adds its parsers to the top-level subparsers (`agl_proxy` adds `agl proxy ...`), so
this module knows only its own `agl store ...` commands.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
from importlib.metadata import entry_points
from typing import Any, Callable, Iterator, List, Optional, Sequence

from .errors import StoreError
from .server import DEFAULT_MAX_BODY_BYTES, create_app

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
    import uvicorn

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
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        sock.close()
        await store.close()
        print(f"agl store serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
    server = _server_class()(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.request_exit)
    announce = asyncio.create_task(_announce_when_started(server, f"http://{host}:{port}", url, bool(args.key)))
    try:
        await server.serve(sockets=[sock])
    finally:
        announce.cancel()
        await store.close()  # idempotent; covers a server that never ran its lifespan
    print("agl store serve: stopped", flush=True)
    return 0 if server.started else 1


def _server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, minus its signal handling: uvicorn re-raises the signal after
        shutting down, which would kill the process before the store is closed."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        def request_exit(self) -> None:
            # A second signal while draining skips the graceful wait.
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True

    return Server


async def _announce_when_started(server: Any, address: str, url: str, keyed: bool) -> None:
    while not server.started:
        await asyncio.sleep(0.01)
    auth = "bearer key required" if keyed else "no key"
    print(f"agl store serve: listening on {address} (store {url}, {auth})", flush=True)


if __name__ == "__main__":
    # Run the imported module's main, so its functions are the ones entry points name.
    from agl_store.cli import main as _main

    sys.exit(_main())
