"""`./scripts/agl demo`: the whole path in one command, here on the suite's tiny vLLM (`--backend`), exiting once
printed."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from agl_store import call_span, open_store
from examples.quickstart.demo import build_parser

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.vllm
async def test_agl_demo_prints_each_rollouts_token_ids_and_the_view_and_stops_the_proxy(vllm_server, tmp_path) -> None:
    db = tmp_path / "demo.db"
    process = await asyncio.create_subprocess_exec(
        REPO / "scripts" / "agl", "demo", "--backend", vllm_server.base_url, "--rollouts", "2", "--no-wait",
        "--db", str(db), cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 180)
    text = out.decode()
    assert process.returncode == 0, text

    assert "[setup] building the tiny model" in text  # it set up what it needs first (here: mostly done already)
    assert "[demo] rollout 1/2: the LangChain agent answers 'What is (3 + 4) * 12?'" in text
    assert "[demo] rollout 2/2: the LangChain agent answers 'What is 17 * 23?'" in text
    assert len(re.findall(r"prompt_token_ids +\(\d+\): \[\d+, \d+", text)) == 2, text
    assert len(re.findall(r"response token_ids \(\d+\): \[\d+", text)) == 2, text
    view = re.search(r"\[demo\] web view: (http://127\.0\.0\.1:\d+)/", text)
    assert view is not None, text
    assert f"agl proxy serve: listening on {view.group(1)}" in text
    assert text.index("[demo] web view") < text.index("agl proxy serve: stopped") < text.index("[demo] done")

    store = await open_store(f"sqlite:///{db}")  # --db kept what the view showed
    try:
        rollouts = await store.query_rollouts()
        assert len(rollouts) == 2
        for rollout in rollouts:
            calls = [s for s in await store.query_spans(rollout.rollout_id) if s.name == call_span.NAME]
            assert calls and calls[0].attributes["agl.prompt_token_ids"]
    finally:
        await store.close()


def test_agl_demo_defaults_and_a_rollout_count_below_one(capsys) -> None:
    parser = build_parser()
    args = parser.parse_args([])
    assert (args.rollouts, args.no_wait, args.backend, args.db, args.port) == (3, False, None, None, 0)
    with pytest.raises(SystemExit):
        parser.parse_args(["--rollouts", "0"])
    assert "--rollouts: must be >= 1, got 0" in capsys.readouterr().err
