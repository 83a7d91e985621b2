"""The quickstart example runs end to end (here against the fake backend, to stay quick)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


async def test_quickstart_prints_the_rollout_spans(backend) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "examples.quickstart.run", "--backend", backend[1], "--model", "tiny",
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    text = out.decode()
    assert process.returncode == 0, text
    assert "agent answer: 'Hello from the fake backend.'" in text
    assert "#1 agl.llm_call tiny" in text and "response token_ids (6): [100, 101, 102, 103, 104, 105]" in text
    assert "#2 reward = 0.0" in text
