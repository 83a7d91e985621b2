"""`AglTrainer.fit()` end to end on the CPU, a few steps of the lowercase-words task
(examples/lowercase_words): the real SQLite store and `agl proxy serve`, the tiny vLLM (its own,
in dev mode), agents as subprocesses through the local runner, and verl's own actor update in
this process (`agl_train.verl_glue.cpu_workers`). One run serves every test of the module."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import torch

from examples.lowercase_words.train import Run, improvement, rewards_by_version, train
from tests.train.fit_helpers import llm_calls_by_version

pytestmark = [
    pytest.mark.slow,
    pytest.mark.training,
    pytest.mark.vllm,
    # torchdata's StatefulDataLoader (built by verl's constructor) warns about its own use of a deprecated torch call.
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

STEPS = 16  # as examples/lowercase_words runs by default; 10 steps sometimes ended before the climb (measured)
ROLLOUTS_PER_STEP = 16  # data.train_batch_size 4 × rollout.n 4
WINDOW = 3  # steps at each end compared by the learning test
LOGPROB_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def run(dev_vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Run:
    address = dev_vllm_server.root_url.removeprefix("http://")
    return train(dev_vllm_server.model_path, address, tmp_path_factory.mktemp("fit"), STEPS, print_lines=False)


def test_fit_runs_every_step_through_verls_actor_update(run: Run) -> None:
    assert [int(m["step"]) for m in run.history] == list(range(1, STEPS + 1))
    for metrics in run.history:
        assert (metrics["rollout/n_done"], metrics["rollout/n_failed"]) == (ROLLOUTS_PER_STEP, 0)
        assert metrics["training/n_update_rows"] == ROLLOUTS_PER_STEP  # one call, one row per rollout
        assert "actor/pg_loss" in metrics and "actor/entropy_loss" in metrics
        # A step whose groups all got equal rewards has zero advantages, so a zero gradient is right
        # there (once the task is learned every rollout scores 1.0); any other step must move the actor.
        has_signal = metrics["critic/advantages/max"] > 0 or metrics["critic/advantages/min"] < 0
        assert metrics["actor/grad_norm"] > 0 if has_signal else metrics["actor/grad_norm"] >= 0
        assert metrics["rollout/proxy_drained"] == 1.0
        assert metrics["timing_s/update_weights"] > 0
    assert any(metrics["actor/grad_norm"] > 0 for metrics in run.history)
    # Validation (one rollout per validation task) before the first step and with the last one.
    assert [int(m["step"]) for m in run.validations] == [0]
    for validation in (run.validations[0], run.history[-1]):
        assert (validation["val/n_done"], validation["val/n_failed"]) == (4, 0) and "val/reward_mean" in validation


def test_each_steps_rollouts_ran_on_the_weights_the_actor_had_at_that_step(run: Run) -> None:
    # verl's rollout-vs-actor check: vLLM's logprobs of the sampled tokens against the actor's
    # old log-probs. Training moves them far (see the next test), so a missed sync shows here.
    diffs = [metrics["training/rollout_probs_diff_max"] for metrics in run.history]
    assert max(diffs) < LOGPROB_TOLERANCE, diffs


def test_after_the_last_sync_vllm_serves_the_trained_weights(run: Run, dev_vllm_server, tokenizer) -> None:
    from transformers import AutoModelForCausalLM

    prompt = tokenizer("The agent calls the weather tool for paris today.").input_ids
    answer = httpx.post(
        f"{dev_vllm_server.base_url}/completions",
        json={"model": dev_vllm_server.model, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0},
        timeout=60,
    ).json()
    served = [
        entry[str(token)]["logprob"]
        for entry, token in zip(answer["choices"][0]["prompt_logprobs"][1:], prompt[1:], strict=False)
    ]
    trained = teacher_forced_logprobs(run.trainer.actor_rollout_wg.model, prompt)
    initial = teacher_forced_logprobs(AutoModelForCausalLM.from_pretrained(dev_vllm_server.model_path), prompt)

    diff = max(abs(a - b) for a, b in zip(served, trained, strict=False))
    moved = max(abs(a - b) for a, b in zip(initial, trained, strict=False))
    print(
        f"\nvLLM vs trainer logprobs after the last sync: max abs diff {diff:.2e} (training moved them by {moved:.2f})"
    )
    assert diff < LOGPROB_TOLERANCE < moved


def teacher_forced_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i ≥ 1, from an HF causal LM."""
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [logprobs[i - 1, ids[i]].item() for i in range(1, len(ids))]


def test_every_span_of_a_step_carries_that_steps_weight_version(run: Run) -> None:
    assert llm_calls_by_version(run.db_path) == {str(step): ROLLOUTS_PER_STEP for step in range(1, STEPS + 1)}


def test_the_model_learns_the_task(run: Run) -> None:
    result = improvement(rewards_by_version(run.db_path), WINDOW)
    print(
        f"\nreward of the first {WINDOW} steps {result['first']:.3f}, of the last {WINDOW} {result['last']:.3f}: "
        f"gain {result['gain']:+.3f}, noise band {result['band']:.3f}"
    )
    assert result["gain"] > result["band"], result


class _NotFound(BaseHTTPRequestHandler):
    """What a vLLM started without VLLM_SERVER_DEV_MODE answers on its dev routes."""

    def do_POST(self) -> None:  # the name http.server calls
        self.send_error(404, "Not Found")

    def log_message(self, *args: object) -> None:
        return None


def test_a_vllm_without_dev_mode_is_refused_with_what_to_set(run: Run, tmp_path: Path) -> None:
    from agl_train.verl_glue.cpu_workers import DiskWeightSync, ExternalReplicas

    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        sync = DiskWeightSync(
            run.trainer.actor_rollout_wg, ExternalReplicas([f"127.0.0.1:{server.server_port}"]), tmp_path
        )
        with pytest.raises(RuntimeError, match="no reload_weights endpoint: start vLLM with VLLM_SERVER_DEV_MODE=1"):
            sync.update_weights(STEPS + 1)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
