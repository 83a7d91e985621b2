"""One line per step a person can read, from verl's file logger (`trainer.logger=[file]`), with the step's warnings."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..core.aggregate import CHAIN_KINDS

HEADER = f"{'step':>4}  {'reward (min..max)':<21}  {'rollouts ok/failed':>18}  {'rows trained/built':>18}  " + (
    f"{'bridged':>7}  {'grad norm':>9}  {'seconds':>7}"
)


class StepPrinter:
    """Follows verl's file logger at `path` and prints one line per step (and the step's warnings, from
    `warn`); keeps the training steps' metrics in `history` and the validations outside a step in `validations`."""

    def __init__(
        self, path: Path, print_lines: bool = True, warn: Callable[[Mapping[str, float]], list[str]] | None = None
    ) -> None:
        self.path = path
        self.print_lines = print_lines
        self.warn = warn
        self.history: list[dict[str, float]] = []
        self.validations: list[dict[str, float]] = []
        self.warnings: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="step-printer", daemon=True)

    def __enter__(self) -> StepPrinter:
        if self.print_lines:
            print(HEADER, flush=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _follow(self) -> None:
        offset = 0
        while True:
            stopping = self._stop.is_set()
            if self.path.exists():
                with open(self.path, "rb") as handle:
                    handle.seek(offset)
                    for line in handle:
                        if not line.endswith(b"\n"):
                            break
                        offset += len(line)
                        self.step(json.loads(line))
            if stopping:
                return
            time.sleep(0.2)

    def step(self, record: dict[str, Any]) -> None:
        """One record of verl's file logger: `{"step": N, "data": {metric: value}}`."""
        metrics = {"step": float(record["step"]), **record["data"]}
        training = "training/global_step" in metrics
        (self.history if training else self.validations).append(metrics)
        warnings = (
            [f"step {int(metrics['step'])}: warning: {w}" for w in self.warn(metrics)] if training and self.warn else []
        )
        self.warnings += warnings
        if self.print_lines:
            print("\n".join([format_step(metrics), *warnings]), flush=True)


def format_step(m: Mapping[str, float]) -> str:
    """A training step as a line (reward mean and range, rollouts succeeded / failed, rows trained / built,
    the share of model calls bridged from the model's own ids, the gradient norm, the step's seconds, and the
    validation reward when it validated); a validation outside a step as its own line."""
    validation = f"  val reward {m['val/reward_mean']:.3f}" if "val/reward_mean" in m else ""
    if "training/global_step" not in m:
        return f"{int(m['step']):>4}{validation.rstrip()}"
    failed = int(m.get("rollout/n_failed", 0) + m.get("rollout/n_timed_out", 0))
    reward = (
        f"{m.get('rollout/reward_mean', math.nan):.3f} ({m.get('rollout/reward_min', math.nan):.2f}.."
        f"{m.get('rollout/reward_max', math.nan):.2f})"
    )
    rows = f"{int(m.get('training/n_update_rows', 0))}/{int(m.get('training/n_rows', 0))}"
    rollouts = f"{int(m.get('rollout/n_done', 0))}/{failed}"
    return (
        f"{int(m['step']):>4}  {reward:<21}  {rollouts:>18}  {rows:>18}  "
        f"{bridged_share(m):>7}  {m.get('actor/grad_norm', math.nan):9.2e}  {m.get('timing_s/step', math.nan):7.1f}"
        f"{validation}"
    )


def bridged_share(m: Mapping[str, float]) -> str:
    """The share of the step's model calls whose prompt the proxy bridged from the model's own ids
    (`-` without calls)."""
    calls = sum(m.get(f"training/n_llm_calls/{kind}", 0.0) for kind in CHAIN_KINDS)
    return f"{m.get('training/n_llm_calls/bridged', 0.0) / calls:.0%}" if calls else "-"
