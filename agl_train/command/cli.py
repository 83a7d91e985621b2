"""`agl train CONFIG`: train the agent a run file names (`train.train`).

Added to the `agl` command through the `agl.commands` entry point.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .errors import RunFileError


def add_train_commands(subparsers: Any) -> None:
    """Add `agl train` to the top-level subparsers."""
    train = subparsers.add_parser("train", help="train an agent from one run file (docs/trainer.md)")
    train.add_argument("config", type=Path, help="the run file (YAML): agent, tasks, model, any agl or verl key")
    train.add_argument("--out", type=Path, default=None, help="run folder (default: the file's `out`, else runs/NAME)")
    train.add_argument("--steps", type=int, default=None, help="training steps (default: the file's, else 4)")
    train.add_argument("--device", choices=("auto", "cpu", "gpu"), default=None, help="default: the file's, else auto")
    train.add_argument(
        "--check-rollout", action="store_true", default=None, help="run one rollout of the first task before training"
    )
    train.add_argument("--check", action="store_true", help="only check the run file, start nothing")
    train.set_defaults(run=_train)


def _train(args: argparse.Namespace) -> int:
    try:
        if args.check:
            return _check(args)
        from .train import train

        train(args.config, out=args.out, steps=args.steps, device=args.device, check_rollout=args.check_rollout)
    except RunFileError as exc:
        print(f"agl train: {exc}", file=sys.stderr)
        return 2
    return 0


def _check(args: argparse.Namespace) -> int:
    from .composed import compose_run_config
    from .run_file import load_run_file
    from .train import PENDING_URL

    run = load_run_file(args.config, args.out)
    compose_run_config(run, run.model, PENDING_URL, cpu=(args.device or run.device) != "gpu")
    print(f"agl train: {run.where}: ok ({len(run.tasks)} tasks, agent {run.agent}, model {run.model})")
    return 0
