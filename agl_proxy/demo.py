"""`agl demo`: the whole path on this machine (registered through the `agl.commands` entry points).

The demo runs the repository's tiny model and its quickstart agent (examples/quickstart/demo.py), so it runs
from a checkout: `./scripts/agl demo` installs what it needs and puts the checkout on the import path. This
module only declares the command, so listing `agl`'s commands imports nothing of the demo.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .cli import positive_int

DEMO_MODULE = "examples.quickstart.demo"


def add_demo_commands(subparsers: Any) -> None:
    """Add `agl demo` to the top-level subparsers."""
    demo = subparsers.add_parser(
        "demo",
        help="tiny vLLM, `agl proxy serve` with its store and view, a LangChain agent's rollouts; serves until Ctrl-C",
    )
    demo.add_argument("--rollouts", type=positive_int, default=3, help="how many agent rollouts to run (default 3)")
    demo.add_argument("--no-wait", action="store_true", help="stop everything and exit once the rollouts are printed")
    demo.add_argument(
        "--backend", metavar="URL", help="a running vLLM's OpenAI base URL instead of starting the tiny model on vLLM"
    )
    demo.add_argument("--model", help="with --backend: the model name it serves (default: the tiny model's)")
    demo.add_argument("--tokenizer", metavar="PATH", help="the view's tokenizer (default: the tiny model's)")
    demo.add_argument("--db", metavar="PATH", help="keep the store in this SQLite file (default: a temporary one)")
    demo.add_argument("--port", type=int, default=0, help="the proxy's port (default 0: a free one)")
    demo.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        from examples.quickstart.demo import run
    except ModuleNotFoundError as exc:
        if exc.name is None or not DEMO_MODULE.startswith(exc.name):
            raise
        print(
            f"agl demo: {DEMO_MODULE} is not importable: run it from a checkout of agl with ./scripts/agl demo",
            file=sys.stderr,
        )
        return 2
    return run(args)
