"""`agl store stats`, `agl store export` and `agl store expire`: a thin command line over the
LightningStore interface, so each works on a store file and on a served store alike.

A step, for `expire`, is a resource set: the trainer publishes one per training step (and per
validation) and each rollout names the set it ran with (`resources_id`); the sets are counted
in the order they were created, from 1. Rollouts without a resource set are never expired by
step, and only finished rollouts are ever deleted (as `delete_rollouts` requires).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any, get_args

import orjson

from .base import LightningStore
from .errors import StoreError
from .exporters import Record, exporter_names, find_exporter
from .models import TERMINAL_ROLLOUT_STATUSES, Rollout, RolloutMode, RolloutStatus
from .opening import db_url

KEY_VARIABLE = "AGL_STORE_KEY"
"""The bearer key sent to a served store, when set."""
PAGE = 500
"""Rollouts read per query."""
PROGRESS_SECONDS = 1.0
"""At most one progress line on stderr per this many seconds (and one at the end)."""
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DB_HELP = (
    "SQLite file path or store URL (sqlite:///PATH, or http://HOST:PORT of `agl store serve`, key in $AGL_STORE_KEY)"
)


class CommandError(Exception):
    """A bad argument or an unusable store: printed after the command's name, exit status 2."""


def add_data_commands(commands: Any) -> None:
    """Add `stats`, `export` and `expire` to the `agl store` subcommands."""
    stats = commands.add_parser(
        "stats",
        help="what a store holds: rollouts by status and mode, spans, bytes, first and last rollout",
        description="Counts of a store's rollouts (by status and mode), attempts and spans, its size on disk, "
        "and when its first and last rollouts started.",
    )
    stats.add_argument("--db", required=True, help=_DB_HELP)
    stats.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    stats.set_defaults(run=_runner(_stats))

    export = commands.add_parser(
        "export",
        help="write spans, or training rows, of the selected rollouts as JSONL or Parquet",
        description="Write one record per line (JSONL) or per row (Parquet) for each selected rollout, oldest "
        "first: --what spans writes every span whole; --what rows (agl_train's exporter) the training rows the "
        "trainer builds (prompt_ids, response_ids, response_mask, logprobs, reward, rollout_id, attempt_id, "
        "level). Progress goes to stderr.",
    )
    export.add_argument("--db", required=True, help=_DB_HELP)
    export.add_argument("--what", required=True, metavar="EXPORTER", help=f"one of {exporter_names()}")
    export.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    export.add_argument("--output", default="-", help="a file, or - for stdout (JSONL only)")
    export.add_argument("--rollout-ids", nargs="+", metavar="ID", help="only these rollouts")
    export.add_argument("--mode", choices=list(get_args(RolloutMode)), help="only rollouts of this mode")
    export.add_argument(
        "--status", action="append", choices=list(get_args(RolloutStatus)), help="only rollouts of this status"
    )
    export.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the exporter, repeatable (rows: level=trajectory|transition, max_prompt_length, "
        "max_response_length)",
    )
    export.set_defaults(run=_runner(_export))

    expire = commands.add_parser(
        "expire",
        help="delete finished rollouts (with their attempts and spans) by age or by training step",
        description="Delete finished rollouts by age (--older-than, by end time) or by step (--keep-steps, "
        "--before-step: a step is a resource set, counted from 1 in creation order). --dry-run lists what "
        "would go; the real run asks first, or goes ahead with --yes.",
    )
    expire.add_argument("--db", required=True, help=_DB_HELP)
    which = expire.add_mutually_exclusive_group(required=True)
    which.add_argument("--older-than", metavar="AGE", help="ended longer ago than AGE: 45s, 30m, 12h, 7d, 2w")
    which.add_argument("--keep-steps", type=int, metavar="N", help="keep the rollouts of the newest N steps")
    which.add_argument("--before-step", type=int, metavar="N", help="the rollouts of steps 1 to N-1")
    expire.add_argument("--dry-run", action="store_true", help="print what would be deleted, delete nothing")
    expire.add_argument("--yes", action="store_true", help="do not ask before deleting")
    expire.set_defaults(run=_runner(_expire))


def _runner(command: Callable[[LightningStore, argparse.Namespace], Any]) -> Callable[[argparse.Namespace], int]:
    """`command` run on the opened `--db` store; a CommandError or a store error is printed,
    exit status 2."""

    def run(args: argparse.Namespace) -> int:
        name = f"agl store {args.store_command}"
        try:
            return int(asyncio.run(_with_store(command, args)) or 0)
        except (CommandError, StoreError, OSError, ValueError) as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 2

    return run


async def _with_store(command: Callable[[LightningStore, argparse.Namespace], Any], args: argparse.Namespace) -> Any:
    async with _opened(args.db) as store:
        return await command(store, args)


@asynccontextmanager
async def _opened(db: str) -> AsyncIterator[LightningStore]:
    """The store at `db`; a file path must exist (opening would create an empty store)."""
    from .opening import open_store

    if "://" not in db and not Path(db).is_file():
        raise CommandError(f"no store file at {db}")
    store = await open_store(db_url(db), key=os.environ.get(KEY_VARIABLE))
    try:
        yield store
    finally:
        await store.close()


# --- stats ---------------------------------------------------------------------------


async def store_stats(store: LightningStore) -> dict[str, Any]:
    """What `agl store stats` prints: the store's `statistics()`, rollouts by status and mode,
    and the start times of its first and last rollouts."""
    stats = (await store.statistics()).model_dump(mode="json")
    by_status_mode: dict[str, dict[str, int]] = {}
    for status, count in sorted(stats.get("rollouts_by_status", {}).items()):
        modes = {}
        for mode in get_args(RolloutMode):
            found = (await store.query_rollouts(status_in=[status], mode=mode, limit=1)).total
            if found:
                modes[mode] = found
        if count - sum(modes.values()):
            modes["none"] = count - sum(modes.values())
        by_status_mode[status] = modes
    stats["rollouts_by_status_and_mode"] = by_status_mode
    first = await store.query_rollouts(sort_by="start_time", sort_order="asc", limit=1)
    last = await store.query_rollouts(sort_by="start_time", sort_order="desc", limit=1)
    stats["first_rollout_start_time"] = first[0].start_time if first else None
    stats["last_rollout_start_time"] = last[0].start_time if last else None
    return stats


def _when(seconds: float | None) -> str:
    return "-" if seconds is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _size(count: int | None) -> str:
    if count is None:
        return "-"
    size = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


async def _stats(store: LightningStore, args: argparse.Namespace) -> int:
    stats = await store_stats(store)
    if args.json:
        sys.stdout.write(orjson.dumps(stats, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    lines = [
        f"store      {db_url(args.db)}",
        f"rollouts   {stats['total_rollouts']}",
        f"attempts   {stats['total_attempts']}",
        f"spans      {stats['total_spans']}",
        f"resources  {stats['total_resources']}",
        f"first      {_when(stats['first_rollout_start_time'])}",
        f"last       {_when(stats['last_rollout_start_time'])}",
        f"bytes      {_size(stats.get('database_bytes'))} on disk (WAL {_size(stats.get('wal_bytes'))}, "
        f"unused {_size(stats.get('unused_bytes'))})",
        "",
        f"{'status':<12}{'mode':<8}{'rollouts':>10}",
    ]
    for status, modes in stats["rollouts_by_status_and_mode"].items():
        for mode, count in modes.items():
            lines.append(f"{status:<12}{mode:<8}{count:>10}")
    print("\n".join(lines))
    return 0


# --- export --------------------------------------------------------------------------


async def selected_rollouts(
    store: LightningStore,
    *,
    rollout_ids: Sequence[str] | None = None,
    mode: RolloutMode | None = None,
    statuses: Sequence[RolloutStatus] | None = None,
) -> AsyncIterator[tuple[Rollout, int]]:
    """The matching rollouts, oldest first, each with how many match in all."""
    offset = 0
    while True:
        page = await store.query_rollouts(
            rollout_id_in=rollout_ids, mode=mode, status_in=statuses, sort_by="start_time", limit=PAGE, offset=offset
        )
        for rollout in page:
            yield rollout, page.total
        offset += len(page)
        if len(page) < PAGE:
            return


def _settings(options: Sequence[str]) -> dict[str, str]:
    settings = {}
    for option in options:
        key, equals, value = option.partition("=")
        if not (equals and key):
            raise CommandError(f"--set {option!r}: expected KEY=VALUE, e.g. level=transition")
        settings[key] = value
    return settings


async def _export(store: LightningStore, args: argparse.Namespace) -> int:
    if args.format == "parquet" and args.output == "-":
        raise CommandError("--format parquet needs --output FILE")
    exporter = find_exporter(args.what, _settings(args.set))
    write_parquet = _parquet_writer() if args.format == "parquet" else None
    records: list[Record] = []
    out: IO[bytes] = sys.stdout.buffer if args.output == "-" else open(args.output, "wb")
    done = total = 0
    shown = time.monotonic()
    try:
        rollouts = selected_rollouts(store, rollout_ids=args.rollout_ids, mode=args.mode, statuses=args.status)
        async for rollout, total in rollouts:
            got = await exporter.records(store, rollout)
            if write_parquet is not None:
                records += got
            else:
                out.write(b"".join(orjson.dumps(record) + b"\n" for record in got))
            done += 1
            if time.monotonic() - shown >= PROGRESS_SECONDS:
                shown = time.monotonic()
                print(f"exported {done}/{total} rollouts", file=sys.stderr, flush=True)
        if write_parquet is not None:
            write_parquet(records, out)
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    print(f"exported {done}/{total} rollouts", file=sys.stderr)
    return 0


def _parquet_writer() -> Callable[[list[Record], IO[bytes]], None]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise CommandError(f"--format parquet needs pyarrow ({exc}): pip install pyarrow") from exc

    def write(records: list[Record], out: IO[bytes]) -> None:
        pq.write_table(pa.Table.from_pylist([_flat(record) for record in records]), out)

    return write


def _flat(record: Record) -> Record:
    """`record` with each object, or list holding an object, as JSON text: spans' attributes
    differ from span to span, so as Parquet structs they would not share one schema."""
    return {
        key: orjson.dumps(value).decode()
        if type(value) is dict or (type(value) is list and any(type(item) in (dict, list) for item in value))
        else value
        for key, value in record.items()
    }


# --- expire --------------------------------------------------------------------------


def parse_age(text: str) -> float:
    """Seconds of an age such as 45s, 30m, 12h, 7d or 2w; CommandError otherwise."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise CommandError(f"--older-than {text!r}: expected a number and a unit (s, m, h, d, w), e.g. 7d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


async def _steps(store: LightningStore) -> list[str]:
    """The resource set ids, oldest first: step 1, step 2, ..."""
    page = await store.query_resources(sort_by="create_time", sort_order="asc")
    return [resources.resources_id for resources in page]


async def expirable(store: LightningStore, args: argparse.Namespace) -> list[Rollout]:
    """The finished rollouts `expire`'s options select, oldest first."""
    keep: Callable[[Rollout], bool]
    if args.older_than is not None:
        cutoff = time.time() - parse_age(args.older_than)
        keep = lambda rollout: rollout.end_time is not None and rollout.end_time < cutoff  # noqa: E731
    else:
        steps = await _steps(store)
        if args.keep_steps is not None:
            if args.keep_steps < 1:
                raise CommandError(f"--keep-steps {args.keep_steps}: expected a positive number of steps")
            old = set(steps[: max(len(steps) - args.keep_steps, 0)])
        else:
            if args.before_step < 1:
                raise CommandError(f"--before-step {args.before_step}: steps are counted from 1")
            old = set(steps[: args.before_step - 1])
        keep = lambda rollout: rollout.resources_id in old  # noqa: E731
    found = []
    async for rollout, _ in selected_rollouts(store, statuses=sorted(TERMINAL_ROLLOUT_STATUSES)):
        if keep(rollout):
            found.append(rollout)
    return found


async def _expire(store: LightningStore, args: argparse.Namespace) -> int:
    rollouts = await expirable(store, args)
    spans = 0
    for rollout in rollouts:
        spans += (await store.query_spans(rollout.rollout_id, limit=1)).total
    stats = await store.statistics()
    share = None
    if stats.database_bytes is not None and stats.total_spans:
        share = stats.database_bytes * spans // stats.total_spans
    verb = "would delete" if args.dry_run else "deleting"
    print(f"{verb} {len(rollouts)} rollouts, {spans} spans, about {_size(share)} (their spans' share of the file)")
    for rollout in rollouts:
        step = rollout.resources_id or "-"
        print(f"  {rollout.rollout_id}  {rollout.status:<10} {step}  ended {_when(rollout.end_time)}")
    if args.dry_run or not rollouts:
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise CommandError("refusing to delete without --yes (stdin is not a terminal to ask on)")
        if input(f"delete these {len(rollouts)} rollouts? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    deleted = await store.delete_rollouts([rollout.rollout_id for rollout in rollouts])
    print(f"deleted {deleted} rollouts")
    return 0
