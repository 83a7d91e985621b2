"""`agl view --store URL`: the web view of rollouts, spans and token masks, served on its own.

Added to the `agl` command through the `agl.commands` entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from agl_store.web.serving import serve_app

from ..core.aggregate import AGGREGATORS, LEVEL_TRAJECTORY, Limits
from .routes import ViewSettings
from .token_view import DEFAULT_LIMITS, TokenViewOptions

DEFAULT_PORT = 4748


def add_view_commands(subparsers: Any) -> None:
    """Add `agl view` to the top-level subparsers."""
    view = subparsers.add_parser("view", help="web view of training steps, rollouts, spans and token masks")
    view.add_argument("--store", required=True, help="store URL: http://host:port, sqlite:///PATH or memory://")
    view.add_argument(
        "--tokenizer",
        default=None,
        help="local tokenizer (model) directory; without it, the published model's when readable here, else raw ids",
    )
    view.add_argument("--key", default=None, help="the store's bearer key; the page then asks for it too")
    view.add_argument("--host", default="127.0.0.1")
    view.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    view.add_argument("--level", default=LEVEL_TRAJECTORY, choices=sorted(AGGREGATORS), help="trace aggregator level")
    view.add_argument("--max-prompt-length", type=int, default=DEFAULT_LIMITS.max_prompt_length)
    view.add_argument("--max-response-length", type=int, default=DEFAULT_LIMITS.max_response_length)
    view.set_defaults(run=_serve)


def settings_from_args(args: argparse.Namespace) -> ViewSettings:
    """The view settings the command line names."""
    limits = Limits(args.max_prompt_length, args.max_response_length)
    return ViewSettings(tokenizer=args.tokenizer, options=TokenViewOptions(level=args.level, limits=limits))


def _serve(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"agl view: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve_async(args, settings))


async def _serve_async(args: argparse.Namespace, settings: ViewSettings) -> int:
    from .app import create_view_app

    app = create_view_app(args.store, key=args.key, settings=settings, host=args.host)
    return await serve_app(app, name="agl view", host=args.host, port=args.port, describe=f"store {args.store}")
