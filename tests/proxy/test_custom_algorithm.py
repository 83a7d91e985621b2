"""The custom-algorithm example runs end to end against the tiny vLLM: its rollouts' spans carry every token id."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


async def test_the_custom_algorithm_reads_the_token_ids_of_its_rollouts(vllm_server, tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "examples.custom_algorithm.run", "--backend", vllm_server.base_url,
        "--model", vllm_server.model, "--db", str(tmp_path / "agl.db"),
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    text = out.decode()
    assert process.returncode == 0, text
    assert "3/3 rollouts finished" in text
    assert text.count("token ids ok, sampling {'temperature': 1.0, 'max_tokens': 16} (mode train)") == 2
    assert text.count("token ids ok, sampling {'temperature': 0.0, 'max_tokens': 16} (mode val)") == 1
    response_lengths = [int(n) for n in re.findall(r"response token_ids \((\d+)\)", text)]
    assert len(response_lengths) == 3 and all(0 < n <= 16 for n in response_lengths)
    assert text.count("reward = ") == 3
