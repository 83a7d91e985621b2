"""Checkpoint and resume through the real `AglTrainer.fit()` on the CPU: an async lowercase-words
run that saves every step is killed (SIGKILL) once the step-2 checkpoint is written; the same
command then resumes it on the same proxy and store. One run pair serves every test."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agl_train.verl_glue.trainer import CARRIED_FILE
from examples.lowercase_words.train import running_proxy

from .fit_runs import BATCH, IN_FLIGHT, N, async_overrides, start_fit, unique_tasks
from .test_fit_cpu import teacher_forced_logprobs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.training,
    pytest.mark.vllm,
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

STEPS = 4  # 8 prompts, BATCH trained per step
KILL_AFTER = 2
CHECKPOINT_WAIT_S = 600.0
LOGPROB_TOLERANCE = 1e-3


@dataclass
class Resumed:
    resumed: list[dict[str, Any]]  # the resumed run's metrics, one dict per step
    carried: dict[str, Any]
    checkpoint: Path
    db_path: Path
    rows_dir: Path


def wait_for_checkpoint(checkpoints: Path, step: int, trainer: subprocess.Popen[bytes]) -> Path:
    """The folder of the step-`step` checkpoint once verl has finished writing it (its tracker file says so)."""
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + CHECKPOINT_WAIT_S
    while time.monotonic() < deadline and trainer.poll() is None:
        if tracker.exists() and tracker.read_text().strip() == str(step):
            return checkpoints / f"global_step_{step}"
        time.sleep(0.05)
    raise AssertionError(f"no step-{step} checkpoint (trainer exit status {trainer.poll()})")


@pytest.fixture(scope="module")
def runs(dev_vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Resumed:
    out = tmp_path_factory.mktemp("fit-resume")
    address = dev_vllm_server.root_url.removeprefix("http://")
    tasks = unique_tasks(STEPS * BATCH)
    with running_proxy(out) as proxy_url:
        config = async_overrides(
            dev_vllm_server.model_path,
            proxy_url,
            out,
            [
                "trainer.val_before_train=false",
                "trainer.test_freq=-1",
                "trainer.save_freq=1",
                "trainer.resume_mode=auto",
                f"trainer.rollout_data_dir={out / 'rows'}",
            ],
        )
        killed = start_fit(config, out / "killed", tasks, unique_tasks(1), address)
        try:
            checkpoint = wait_for_checkpoint(out / "checkpoints", KILL_AFTER, killed)
            killed.send_signal(signal.SIGKILL)
        finally:
            killed.kill()
            killed.wait()
        carried = json.loads((checkpoint / CARRIED_FILE).read_text())
        # The same command again: verl's resume_mode=auto finds the checkpoint.
        resumed = start_fit(config, out / "resumed", tasks, unique_tasks(1), address)
        assert resumed.wait(timeout=CHECKPOINT_WAIT_S) == 0, (out / "resumed" / "trainer.log").read_text()[-3000:]
    lines = (out / "resumed" / "metrics.jsonl").read_text().splitlines()
    history = [{"step": record["step"], **record["data"]} for record in map(json.loads, lines)]
    return Resumed(history, carried, checkpoint, db_path=out / "agl.db", rows_dir=out / "rows")


def test_the_resumed_run_continues_after_the_checkpoint(runs: Resumed) -> None:
    assert [int(m["step"]) for m in runs.resumed] == list(range(KILL_AFTER + 1, STEPS + 1))
    # Groups in flight at the checkpoint are recorded by their rollouts, the rest of the draw as prompts.
    assert len(runs.carried["in_flight"]) == IN_FLIGHT - BATCH
    assert all(len(group["rollout_ids"]) == N for group in runs.carried["in_flight"])


def test_groups_in_flight_at_the_kill_are_trained_not_rolled_out_again(runs: Resumed) -> None:
    groups = asyncio.run(train_groups(runs.db_path))
    # Every prompt was enqueued as one group of N rollouts, over both runs together.
    assert Counter(prompt for prompt, _ in groups.values()) == {task["prompt"]: 1 for task in unique_tasks(8)}
    assert all(count == N for _, count in groups.values())
    trained_after_resume = {
        json.loads(line)["uid"]
        for step in range(KILL_AFTER + 1, STEPS + 1)
        for line in (runs.rows_dir / f"{step}.jsonl").read_text().splitlines()
    }
    assert {group["uid"] for group in runs.carried["in_flight"]} <= trained_after_resume
    assert len(trained_after_resume) == (STEPS - KILL_AFTER) * BATCH


async def train_groups(db_path: Path) -> dict[str, tuple[str, int]]:
    """uid → (prompt, rollouts) of the training rollouts in the store."""
    from agl_store.sqlite import SQLiteStore

    store = await SQLiteStore(str(db_path)).open()
    try:
        groups: dict[str, tuple[str, int]] = {}
        for rollout in await store.query_rollouts(mode="train"):
            uid = rollout.metadata["agl.uid"]
            groups[uid] = (rollout.input["prompt"], groups.get(uid, ("", 0))[1] + 1)
        return groups
    finally:
        await store.close()


def test_after_the_resume_vllm_serves_the_checkpoints_weights(runs: Resumed, dev_vllm_server) -> None:
    # The first resumed step's calls (weight version KILL_AFTER + 1) ran on what the resumed
    # trainer synced: their vLLM logprobs against the checkpoint's actor, teacher-forced.
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(dev_vllm_server.model_path)
    state = torch.load(runs.checkpoint / "actor" / "model_world_size_1_rank_0.pt", weights_only=False)
    model.load_state_dict(state)
    calls = asyncio.run(calls_of_version(runs.db_path, str(KILL_AFTER + 1)))
    assert calls
    diff = 0.0
    for prompt, response, served in calls:
        expected = teacher_forced_logprobs(model, [*prompt, *response])[len(prompt) - 1 :]
        diff = max(diff, *(abs(a - b) for a, b in zip(served, expected, strict=True)))
    print(f"\nvLLM vs checkpoint logprobs after the resume: max abs diff {diff:.2e} over {len(calls)} calls")
    assert diff < LOGPROB_TOLERANCE


async def calls_of_version(db_path: Path, version: str) -> list[tuple[list[int], list[int], list[float]]]:
    """(prompt ids, response ids, vLLM's logprobs) of the training calls of weight version `version`."""
    from agl_store import call_span
    from agl_store.sqlite import SQLiteStore

    store = await SQLiteStore(str(db_path)).open()
    try:
        calls = []
        for rollout in await store.query_rollouts(mode="train"):
            for span in await store.query_spans(rollout.rollout_id, name=call_span.NAME):
                choices = span.attributes.get(call_span.CHOICES) or []
                if span.attributes.get(call_span.MODEL_VERSION) == version and choices and choices[0]["logprobs"]:
                    prompt = list(span.attributes[call_span.PROMPT_TOKEN_IDS])
                    calls.append((prompt, list(choices[0]["token_ids"]), list(choices[0]["logprobs"])))
        return calls
    finally:
        await store.close()
