"""agl_train: from token-level spans to verl training rows, advantages and losses.

The layout is the architecture (docs/architecture.md), each subpackage importing only those
before it:

- `core`: spans to calls to rows, prefix breaks, the update cap (pure Python);
- `algo`: advantages, the per-rollout loss, rows to tensors (torch, no verl);
- `runner`: rollout execution, prompt groups, proxy control, retention (no torch, no verl);
- `view`: the web view (builds rows with `core`; no torch, no verl);
- `verl_glue`: the trainer on verl, the only subpackage that imports verl (through `_verl`);
- `command`: `agl train RUN.yaml`, a whole run from one file (all of the above).

The package exports one function, `train` (`agl train` as one call, imported when called); for
anything else import names from the modules that define them. Importing the package is free, so
`agl store serve` can load the web view (`agl_train.view`) through an entry point without paying
for torch. A module's old path from before this layout
(`agl_train.entry`) fails with an ImportError naming its new one (`_moved`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _moved

if TYPE_CHECKING:
    from .command.train import TrainResult

_moved.install()


def train(config: str | Path | Mapping[str, Any], **options: Any) -> TrainResult:
    """`agl train CONFIG` as one call: `agl_train.command.train.train` (its `options`: `out`, `steps`,
    `device`, `check_rollout`, `print_lines`)."""
    from .command.train import train as run

    return run(config, **options)
