"""`./scripts/agl demo` shows the product: bridged follow-up calls, one training row per rollout, the token view.

It runs here on the suite's real-vocabulary vLLM (`--backend`), so it costs the rollouts, not a vLLM start-up.
"""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import httpx
import pytest

from agl_store import open_store
from agl_train.core.aggregate import LEVEL_TRAJECTORY, Limits, aggregate
from agl_train.core.traces import read_rollout
from examples.demo.run import build_parser

REPO = Path(__file__).resolve().parents[2]
ROLLOUTS = 2
ROW = re.compile(r"prompt (\d+) \+ response (\d+) tokens: (\d+) trained \(the model's own\), (\d+) masked")


async def _read_until(stream: asyncio.StreamReader, marker: str, lines: list[str]) -> None:
    """Collect the demo's lines until one holds `marker` (it then serves until stopped)."""
    while not any(marker in line for line in lines):
        line = await stream.readline()
        if not line:
            raise AssertionError("the demo ended before " + marker + ":\n" + "".join(lines))
        lines.append(line.decode())


@pytest.mark.vllm
async def test_agl_demo_shows_bridged_calls_one_row_per_rollout_and_serves_the_token_view(
    real_vllm_server, tmp_path
) -> None:
    db = tmp_path / "demo.db"
    process = await asyncio.create_subprocess_exec(
        REPO / "scripts" / "agl", "demo", "--backend", real_vllm_server.base_url, "--rollouts", str(ROLLOUTS),
        "--db", str(db), cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    try:
        await asyncio.wait_for(_read_until(process.stdout, "[demo] serving until Ctrl-C", lines), 180)
        text = "".join(lines)
        assert "[setup] building the real-vocabulary tiny model" in text  # it set up what it needs first
        view = re.search(r"\[demo\] web view: (http://127\.0\.0\.1:\d+)/", text)
        assert view is not None, text
        rollout_ids = re.findall(r"token view: http://127\.0\.0\.1:\d+/#/rollouts/(ro-[0-9a-f]+)/tokens", text)
        assert len(rollout_ids) == ROLLOUTS, text

        async with httpx.AsyncClient(base_url=view.group(1), timeout=30) as http:
            assert "<html" in (await http.get("/")).text.lower()  # the view's page
            for rollout_id in rollout_ids:  # what its token view shows: one row, decoded with the model's tokenizer
                tokens = (await http.get(f"/view/api/rollouts/{rollout_id}/tokens")).json()
                assert tokens["tokenizer"] == str(real_vllm_server.model_path), tokens["tokenizer"]
                assert len(tokens["rows"]) == 1 and tokens["pieces"]
                assert {"g", "i"} <= set(tokens["rows"][0]["roles"])  # trained and masked tokens
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)  # Ctrl-C: the proxy stops, then the demo
        rest, _ = await asyncio.wait_for(process.communicate(), 60)
        lines.append(rest.decode())
    text = "".join(lines)
    assert process.returncode == 0, text
    stops = ("[demo] serving until Ctrl-C", "agl proxy serve: stopped", "[demo] done")
    assert [text.index(line) for line in stops] == sorted(text.index(line) for line in stops), text

    blocks = text.split("[demo] rollout ")[1:]
    assert len(blocks) == ROLLOUTS, text
    assert f"[demo] {ROLLOUTS} rollouts: {2 * ROLLOUTS} of {2 * ROLLOUTS} follow-up calls bridged" in text, text
    printed_rows = []
    for block in blocks:
        assert re.search(r"call #\d+ +rendered \(first_call\)", block), block
        assert len(re.findall(r"call #\d+ +bridged from #\d+ ", block)) == 2, block  # both follow-ups bridged
        assert block.count("training row 1 of 1 (trajectory level") == 1, block  # the three calls: one row
        assert re.search(r"trained +\d+  '", block) and re.search(r"masked +\d+  '", block), block  # runs, as text
        row = ROW.search(block)
        assert row is not None, block
        printed_rows.append(tuple(map(int, row.groups())))

    store = await open_store(f"sqlite:///{db}")  # --db kept the store: the printed rows are the trainer's
    try:
        limits = Limits(max_prompt_length=2048, max_response_length=8192)
        for rollout_id, printed in zip(rollout_ids, printed_rows, strict=True):
            (row,) = aggregate([await read_rollout(store, rollout_id)], LEVEL_TRAJECTORY, limits).rows
            trained = sum(row.response_mask)
            assert printed == (len(row.prompt_ids), len(row.response_ids), trained, len(row.response_ids) - trained)
            assert trained > 0 and len(row.response_ids) > trained
    finally:
        await store.close()


def test_agl_demo_defaults_and_a_rollout_count_below_one(capsys) -> None:
    parser = build_parser()
    args = parser.parse_args([])
    assert (args.rollouts, args.no_wait, args.backend, args.db, args.port) == (3, False, None, None, 0)
    with pytest.raises(SystemExit):
        parser.parse_args(["--rollouts", "0"])
    assert "--rollouts: must be >= 1, got 0" in capsys.readouterr().err


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements" / name).read_text().splitlines():
        requirement = line.split("#")[0].strip()
        if "==" in requirement:
            package, version = requirement.split("==")
            pins[re.sub(r"[-_.]+", "-", package).lower()] = version.strip()
    return pins


def test_the_demos_requirements_are_a_subset_of_the_tests_at_the_same_versions() -> None:
    """A venv set up for the tests serves the demo as it is (scripts/setup.sh demo skips its install there)."""
    demo, test = _pins("demo.txt"), _pins("test.txt")
    assert demo and {package: test.get(package) for package in demo} == demo
    assert not {"pytest", "ruff", "mypy", "playwright", "verl", "litellm", "langchain-core"} & demo.keys()


def test_the_row_is_shown_run_by_run_and_long_runs_keep_their_end() -> None:
    from examples.demo.report import MAX_TEXT, mask_runs, shown

    assert list(mask_runs([1, 1, 0, 0, 0, 1])) == [(1, 0, 2), (0, 2, 5), (1, 5, 6)]
    assert list(mask_runs([])) == []
    tool_result = "<|im_start|>user\n<tool_response>\nknown: paris (1 of 3)\n</tool_response><|im_end|>\n"
    text = shown("x" * 200 + tool_result)
    assert len(text) <= MAX_TEXT and text.startswith("'xxx")
    assert text.endswith("(1 of 3)\\n</tool_response><|im_end|>\\n'")  # the tool result, at the run's end
