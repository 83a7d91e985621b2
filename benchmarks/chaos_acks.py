"""The chaos run's check that no acknowledged span is lost (benchmarks/chaos_run.py).

A span is acknowledged once the store answered the proxy's exporter with a 2xx for it: the
proxy's `agl_proxy_spans_exported_total` counts those since the proxy process started. Just before
a part is killed (and once at the end) a probe scrapes that counter, then reads the database file
(read-only, beside the store that writes it): the proxy's call spans there must number at least
those the store held when this proxy started plus the counter, and every span the probe saw must
still be in the file at the end of the run (a SIGKILLed SQLite store keeps what it committed, and
it answers only after the commit). Spans a killed proxy had buffered but not exported were never
acknowledged and are not counted.
"""

from __future__ import annotations

import contextlib
import sqlite3
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from agl_store.call_span import NAME as CALL_SPAN_NAME

EXPORTED_METRIC = "agl_proxy_spans_exported_total"
SpanKey = tuple[str, str, str]  # rollout, attempt, span id


@dataclass
class Probe:
    before: str  # what was about to happen: "kill store", "kill proxy", "end"
    exported: int  # the proxy's acknowledged spans since it started
    base: int  # call spans in the file when that proxy started
    in_file: int  # call spans in the file just after the scrape

    @property
    def missing(self) -> int:
        return max(self.base + self.exported - self.in_file, 0)


@dataclass
class AckLedger:
    db: Path
    base: int = 0
    probes: list[Probe] = field(default_factory=list)
    seen: set[SpanKey] = field(default_factory=set)

    def _spans(self) -> tuple[int, set[SpanKey]]:
        if not self.db.exists():
            return 0, set()
        with contextlib.closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)) as conn:
            keys = {(r, a, s) for r, a, s in conn.execute("SELECT rollout_id, attempt_id, span_id FROM spans")}
            (calls,) = conn.execute("SELECT count(*) FROM spans WHERE name = ?", (CALL_SPAN_NAME,)).fetchone()
        return int(calls), keys

    def proxy_starting(self) -> None:
        """Before a proxy process starts: what its counter will add to."""
        self.base = self._spans()[0]

    def probe(self, proxy_url: str, before: str) -> Probe:
        """Scrape the proxy's counter, then read the file (so later acknowledgements only add)."""
        with urllib.request.urlopen(f"{proxy_url}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        exported = next(int(float(line.split()[-1])) for line in text.splitlines() if line.startswith(EXPORTED_METRIC))
        calls, keys = self._spans()
        self.seen |= keys
        probe = Probe(before, exported, self.base, calls)
        self.probes.append(probe)
        return probe

    def lost(self) -> list[str]:
        """Each probe short of acknowledged spans, and spans a probe saw that the file no longer holds."""
        short = [
            f"{p.before}: {p.missing} of {p.base + p.exported} acknowledged call spans absent" for p in self.probes
        ]
        gone = self.seen - self._spans()[1]
        return [line for p, line in zip(self.probes, short, strict=True) if p.missing] + (
            [f"{len(gone)} spans seen in the file before a kill are gone"] if gone else []
        )
