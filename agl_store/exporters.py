"""The plug-in contract of `agl store export`: what an `agl.exporters` entry point is and returns.

An exporter turns one rollout of a store into records (JSON-able dicts), one line of JSONL or
one Parquet row each. The store has one built in, `spans` (every span of the rollout, whole);
others are plug-ins that know more than the store does: agl_train's `rows` builds the training
rows its trainer would. Each entry point of the group names an `ExporterFactory`, called with
the `--set KEY=VALUE` options of the command; the plug-in implements these types, it does not
define them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol

from .base import LightningStore
from .models import Rollout

EXPORTERS_ENTRY_POINT_GROUP = "agl.exporters"
SPANS = "spans"

Record = dict[str, Any]


class RolloutRecords(Protocol):
    """The records of one rollout; the store's errors pass through."""

    def __call__(self, store: LightningStore, rollout: Rollout) -> Awaitable[list[Record]]: ...


@dataclass(frozen=True)
class Exporter:
    """What an exporter plug-in gives `agl store export`."""

    records: RolloutRecords
    description: str
    """One line for `agl store export --help` and the error that lists the exporters."""


class ExporterFactory(Protocol):
    """The callable an `agl.exporters` entry point names. Raises ValueError for a setting it
    does not know or cannot use."""

    def __call__(self, settings: Mapping[str, str]) -> Exporter: ...


async def _spans(store: LightningStore, rollout: Rollout) -> list[Record]:
    spans = await store.query_spans(rollout.rollout_id)
    return [span.model_dump(mode="json") for span in spans]


def spans_exporter(settings: Mapping[str, str]) -> Exporter:
    """The built-in exporter: every span of the rollout's attempts, whole, in sequence order."""
    if settings:
        raise ValueError(f"the {SPANS} export takes no settings, got {sorted(settings)}")
    return Exporter(_spans, "every span of each rollout (all attempts), whole, in sequence order")


def exporter_names() -> list[str]:
    """`spans` and the installed plug-ins' names (none is imported)."""
    return [SPANS, *sorted(entry.name for entry in entry_points(group=EXPORTERS_ENTRY_POINT_GROUP))]


def find_exporter(name: str, settings: Mapping[str, str]) -> Exporter:
    """The exporter `name` with `settings`. ValueError for an unknown name (listing the known
    ones), a plug-in that fails to import (naming it), or settings it refuses; TypeError for a
    plug-in that returns anything but an `Exporter`."""
    if name == SPANS:
        return spans_exporter(settings)
    for entry in entry_points(group=EXPORTERS_ENTRY_POINT_GROUP):
        if entry.name != name:
            continue
        try:
            factory: ExporterFactory = entry.load()
        except ImportError as exc:
            raise ValueError(f"export {name!r}: cannot import {entry.value}: {exc}") from exc
        exporter = factory(settings)
        if not isinstance(exporter, Exporter):
            raise TypeError(f"exporter {name!r} returned {type(exporter).__name__}, not Exporter")
        return exporter
    raise ValueError(f"unknown export {name!r}; the installed exporters are {exporter_names()}")
