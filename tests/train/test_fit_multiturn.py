"""`AglTrainer.fit()` on the CPU with a multi-turn, tool-using agent (examples/word_lookup): three
model calls per rollout on the real-vocabulary tiny model, sampled freely at temperature 1, a tool
result appended between them. What agl adds to verl is checked on the batches the actor really
trained on (recorded by `RolloutHooks.on_batch`, tests/train/recording_hooks.py) against the calls
in the store: follow-up prompts bridged from the model's own ids, trajectory rows, masks, prefix
breaks, the rollout-level advantage, `per_rollout_mean` and the update cap. Two runs share one
dev-mode vLLM with the token-in endpoints (the example's), in groups of 2: one trajectory-level step
(the example's last 4 prompts, the turn-counter one among them) and one capped transition-level step. That the
model learns is shown by `tests/train/test_fit_cpu.py` (the lowercase task, 16 steps) in the suite
and by the example's own 16-step run (examples/word_lookup/README.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from examples.lowercase_words.train import Run
from examples.word_lookup.agent import TURNS
from examples.word_lookup.train import TURN_COUNTER, tasks, train
from tests.train import recording_hooks
from tests.train.fit_helpers import llm_calls_by_version, traces_by_step
from tests.train.recording_hooks import StepBatch

from .conftest import Served

pytestmark = [
    pytest.mark.slow,
    pytest.mark.training,
    pytest.mark.vllm,
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

STEPS = 1
ROLLOUT_N = 2  # the example's 4 halved: the rows, masks and advantages checked here need groups, not large ones
ROLLOUTS_PER_STEP = 4 * ROLLOUT_N  # data.train_batch_size 4
IN_ORDER = "data.shuffle=false"
MINI_BATCH_ROWS = 2 * ROLLOUT_N  # ppo_mini_batch_size 2
# verl takes whole micro-batches: with mini-batches of 4 rows, micro-batches of 4.
SMALL_GROUPS = [
    f"actor_rollout_ref.rollout.n={ROLLOUT_N}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MINI_BATCH_ROWS}",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MINI_BATCH_ROWS}",
]
CAPPED_STEPS = 1
CAPPED_TASKS_PER_STEP = 4  # two forced groups and two sampled ones
NO_VALIDATION = ["trainer.val_before_train=false", "trainer.test_freq=-1"]
MAX_PPO_UPDATE_TIMES = 2
HOOKS = "agentlightning.hooks=tests.train.recording_hooks"


@dataclass
class Recorded:
    """A run, what its hooks saw, and its rollouts as the store holds them, by step."""

    run: Run
    calls: list[str]
    batches: dict[int, StepBatch]
    traces: dict[int, list]

    def metrics(self, step: int) -> dict[str, float]:
        return self.run.history[step - 1]


def run_recorded(served: Served, out: Path, steps: int, level: str, extra: Sequence[str] = (), **kwargs) -> Recorded:
    recording_hooks.reset()
    extra = [HOOKS, *NO_VALIDATION, *SMALL_GROUPS, *extra]
    run = train(served.model_path, served.address, out, steps, level=level, print_lines=False, extra=extra, **kwargs)
    recorded = Recorded(run, list(recording_hooks.CALLS), dict(recording_hooks.BATCHES), traces_by_step(run.db_path))
    recording_hooks.reset()
    return recorded


@pytest.fixture(scope="module")
def trajectory(real_dev_vllm: Served, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """`STEPS` steps at lr 0.05 (the example's 0.03 is for 16 steps) on the example's last 4 prompts, in
    order: the last has the turn counter."""
    extra = ["actor_rollout_ref.actor.optim.lr=0.05", IN_ORDER]
    in_order = tasks(4 * STEPS, offset=4)
    return run_recorded(
        real_dev_vllm, tmp_path_factory.mktemp("trajectory"), STEPS, "trajectory", extra=extra, train_tasks=in_order
    )


@pytest.fixture(scope="module")
def capped_transition(real_dev_vllm: Served, real_tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """Transition rows (3 per rollout, 24 per step) capped at 2 mini-batches of 4 rows. Each step
    trains two groups whose answers are forced equal (vLLM's `allowed_token_ids` with one token:
    the trainer imposes its sampling temperature on every call, so an agent cannot ask for greedy
    answers) and two sampled ones, in that order."""
    (weather,) = real_tokenizer.encode(" weather", add_special_tokens=False)
    forced = [task | {"allowed_token_ids": [weather]} for task in tasks(2)]
    sampled = tasks(2, offset=2)
    in_order = [task for _ in range(CAPPED_STEPS) for pair in zip(forced, sampled, strict=True) for task in pair]
    return run_recorded(
        real_dev_vllm,
        tmp_path_factory.mktemp("transition"),
        CAPPED_STEPS,
        "transition",
        extra=[f"agentlightning.max_ppo_update_times={MAX_PPO_UPDATE_TIMES}", IN_ORDER],
        train_tasks=in_order,
    )


# --- reading a recorded batch ----------------------------------------------------------------


def row_tokens(batch: StepBatch, b: int) -> tuple[list[int], list[int], list[int]]:
    """Row b's prompt, response and response mask, without padding."""
    p_len = batch.prompts.shape[1]
    valid = batch.attention_mask[b].bool()
    n_response = int(valid[p_len:].sum())
    prompt = batch.prompts[b][valid[:p_len]].tolist()
    return prompt, batch.responses[b, :n_response].tolist(), batch.response_mask[b, :n_response].tolist()


def generated_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """The [start, end) spans of consecutive 1s of a response mask: one per call merged into the row."""
    runs, start = [], None
    for i, value in enumerate([*mask, 0]):
        if value and start is None:
            start = i
        elif not value and start is not None:
            runs.append((start, i))
            start = None
    return runs


def rollout_advantages(traces: Sequence) -> dict[str, float]:
    """verl's GRPO advantage over the step's rollouts (one score per rollout, grouped by uid)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    scores = torch.tensor([[trace.reward] for trace in traces], dtype=torch.float32)
    advantages, _ = compute_grpo_outcome_advantage(
        scores, torch.ones_like(scores), np.array([trace.uid for trace in traces], dtype=object)
    )
    return {trace.rollout_id: float(a) for trace, a in zip(traces, advantages[:, 0], strict=True)}


def extends(prompt: Sequence[int], previous_prompt: Sequence[int], previous_response: Sequence[int]) -> bool:
    context = [*previous_prompt, *previous_response]
    return list(prompt[: len(context)]) == context


# --- trajectory level ------------------------------------------------------------------------


def test_every_step_runs_three_calls_per_rollout_through_verls_update(trajectory: Recorded) -> None:
    assert [int(m["step"]) for m in trajectory.run.history] == list(range(1, STEPS + 1))
    for metrics in trajectory.run.history:
        assert (metrics["rollout/n_done"], metrics["rollout/n_failed"]) == (ROLLOUTS_PER_STEP, 0)
        assert metrics["rollout/proxy_drained"] == 1.0 and "actor/pg_loss" in metrics
        assert metrics["training/n_truncated_sample"] == metrics["training/n_sample_dropped/marked"] == 0
    assert llm_calls_by_version(trajectory.run.db_path) == {
        str(step): TURNS * ROLLOUTS_PER_STEP for step in range(1, STEPS + 1)
    }


def test_every_follow_up_is_bridged_from_the_models_ids_but_the_turn_counters(
    trajectory: Recorded, real_tokenizer
) -> None:
    """Free sampling over 151,936 ids writes what the tokenizer would not give back from text; the
    proxy bridges each follow-up's prompt from the sampled ids all the same. Only the turn-counter
    tasks' follow-ups branch: their system prompt changed (one row per call, on purpose)."""
    for step, traces in trajectory.traces.items():
        metrics = trajectory.metrics(step)
        first_turn = TURN_COUNTER.format(turn=1)
        counters = sum(first_turn in real_tokenizer.decode(trace.calls[0].prompt_ids) for trace in traces)
        breaks = sum(
            not extends(call.prompt_ids, previous.prompt_ids, previous.response_ids)
            for trace in traces
            for previous, call in zip(trace.calls, trace.calls[1:], strict=False)
        )
        assert breaks == (TURNS - 1) * counters == metrics["training/n_prefix_breaks"], step
        assert metrics["training/n_llm_calls/bridged"] == (TURNS - 1) * (len(traces) - counters), step
        branched = metrics["training/n_llm_calls/branched"]
        # A cause's metric is there only in the steps that had such a call.
        assert branched == breaks == metrics.get("training/n_llm_calls/branched/system_changed", 0)
        assert metrics["training/rows_per_rollout/max"] == (TURNS if counters else 1)


def test_on_startup_runs_once_through_fit_before_the_first_batch(trajectory: Recorded) -> None:
    assert trajectory.calls == ["startup", *(f"batch {step}" for step in range(1, STEPS + 1))]


def test_the_calls_of_a_rollout_merge_into_rows_with_the_inserted_tokens_masked(
    trajectory: Recorded, real_tokenizer
) -> None:
    merged_calls: Counter[int] = Counter()
    inserted_text = ""
    for step, batch in trajectory.batches.items():
        calls = {trace.rollout_id: trace.calls for trace in trajectory.traces[step]}
        for b in range(len(batch)):
            prompt, response, mask = row_tokens(batch, b)
            first = int(batch.turn_index[b])
            runs = generated_runs(mask)
            row_calls = calls[batch.rollout_id[b]][first : first + len(runs)]
            merged_calls[len(runs)] += 1
            # The row is its first call's prompt, then each call's generated ids (mask 1) with what
            # the agent appended in between (mask 0): the last call's prompt + response.
            assert prompt == list(row_calls[0].prompt_ids)
            assert [response[start:end] for start, end in runs] == [list(call.response_ids) for call in row_calls]
            assert prompt + response == [*row_calls[-1].prompt_ids, *row_calls[-1].response_ids]
            inserted_text += real_tokenizer.decode([t for t, m in zip(response, mask, strict=True) if not m])
    print(f"\ncalls merged per row, over the update rows of {STEPS} steps: {dict(sorted(merged_calls.items()))}")
    # Most rollouts are one row of three calls; a turn-counter rollout is three rows of one.
    assert merged_calls[TURNS] > (merged_calls[TURNS] + merged_calls[1] / TURNS) / 2
    assert "<tool_call>" in inserted_text and "<tool_response>" in inserted_text and "known:" in inserted_text


def test_a_rollout_whose_history_was_rendered_differently_splits_and_is_counted(trajectory: Recorded) -> None:
    rows_per_rollout: Counter[int] = Counter()
    for step, traces in trajectory.traces.items():
        # A split wherever a call's prompt does not extend the previous prompt + response: the
        # turn-counter tasks' follow-ups (the proxy bridges every other one).
        breaks = {
            trace.rollout_id: sum(
                not extends(call.prompt_ids, previous.prompt_ids, previous.response_ids)
                for previous, call in zip(trace.calls, trace.calls[1:], strict=False)
            )
            for trace in traces
        }
        metrics = trajectory.metrics(step)
        assert metrics["training/n_prefix_breaks"] == sum(breaks.values())
        assert metrics["training/n_rows"] == len(traces) + sum(breaks.values())
        rows_per_rollout.update(1 + n for n in breaks.values())
        batch = trajectory.batches[step]
        for rollout_id, n_rows in Counter(batch.rollout_id.tolist()).items():
            assert n_rows <= 1 + breaks[rollout_id]  # the update cap may drop some rows, never add
    print(f"\nrows per rollout over {STEPS} steps: {dict(sorted(rows_per_rollout.items()))}")
    # Every eighth task rewrites its system prompt each turn: three rows, one per call.
    assert rows_per_rollout[1] > 0 and rows_per_rollout[TURNS] > 0


def test_per_rollout_mean_weighs_every_rollout_by_its_advantage_over_the_rows_of_the_step(
    trajectory: Recorded,
) -> None:
    assert any(max(Counter(batch.rollout_id.tolist()).values()) > 1 for batch in trajectory.batches.values())
    for step, batch in trajectory.batches.items():
        expected = rollout_advantages(trajectory.traces[step])
        n_rows = len(batch)
        assert n_rows == trajectory.metrics(step)["training/n_update_rows"]
        assert not batch.advantages[batch.response_mask == 0].any()  # nothing on inserted tokens or padding
        for rollout_id in set(batch.rollout_id.tolist()):
            rows = torch.from_numpy(batch.rollout_id == rollout_id)
            # Every token of a rollout carries A_r / (N * T_r): the sum over its tokens is A_r / N, sign
            # included (a row trained against its rollout's reward would show here).
            total = float(batch.advantages[rows].sum())
            assert total == pytest.approx(expected[rollout_id] / n_rows, rel=1e-4, abs=1e-7), (step, rollout_id)


# --- transition level, capped ----------------------------------------------------------------


def test_transition_rows_are_one_per_call_with_the_rollouts_advantage_on_each(capped_transition: Recorded) -> None:
    assert capped_transition.calls == ["startup", *(f"batch {step}" for step in range(1, CAPPED_STEPS + 1))]
    for step, batch in capped_transition.batches.items():
        metrics = capped_transition.metrics(step)
        assert (
            metrics["training/n_rows"] == TURNS * CAPPED_TASKS_PER_STEP * ROLLOUT_N
            and metrics["training/n_prefix_breaks"] == 0
        )
        expected = rollout_advantages(capped_transition.traces[step])
        calls = {trace.rollout_id: trace.calls for trace in capped_transition.traces[step]}
        n_rows = len(batch)
        for rollout_id in set(batch.rollout_id.tolist()):
            rows = np.flatnonzero(batch.rollout_id == rollout_id)
            tokens = int(batch.response_mask[rows].sum())
            for b in rows:
                prompt, response, mask = row_tokens(batch, b)
                call = calls[rollout_id][int(batch.turn_index[b])]
                assert (prompt, response, mask) == (list(call.prompt_ids), list(call.response_ids), [1] * len(response))
                # Â = A_r / (T_r · N) on every token of every row of the rollout.
                scaled = batch.advantages[b, : len(response)] * tokens * n_rows
                assert torch.allclose(scaled, torch.full_like(scaled, expected[rollout_id]), rtol=1e-4, atol=1e-6)


def test_the_update_cap_keeps_whole_mini_batches_dropping_same_reward_groups_first(
    capped_transition: Recorded,
) -> None:
    for step, batch in capped_transition.batches.items():
        metrics = capped_transition.metrics(step)
        traces = capped_transition.traces[step]
        rewards: dict[str, set[float]] = {}
        for trace in traces:
            rewards.setdefault(trace.uid, set()).add(trace.reward)
        same = {uid for uid, values in rewards.items() if len(values) == 1}
        same_rows = TURNS * sum(trace.uid in same for trace in traces)
        n_rows, kept = int(metrics["training/n_rows"]), MINI_BATCH_ROWS * MAX_PPO_UPDATE_TIMES
        assert len(batch) == metrics["training/n_update_rows"] == kept < n_rows
        dropped = n_rows - kept
        assert same, f"step {step}: no group of equal rewards (the forced groups should be): {rewards}"
        print(
            f"\nstep {step}: {n_rows} rows, {len(same)} equal-reward groups ({same_rows} rows), kept {kept}, dropped "
            f"{metrics['training/n_sample_dropped/same_reward']:.0f} same-reward "
            f"+ {metrics['training/n_sample_dropped/random']:.0f} random"
        )
        assert metrics["training/n_sample_dropped/same_reward"] == min(dropped, same_rows)
        assert metrics["training/n_sample_dropped/random"] == dropped - min(dropped, same_rows)
        kept_uids = set(batch.uid.tolist())
        if dropped >= same_rows:  # every row of an equal-reward group went before any other
            assert not kept_uids & same
        else:  # only rows of equal-reward groups went
            assert Counter(uid for uid in batch.uid.tolist() if uid not in same) == Counter(
                trace.uid for trace in traces for _ in range(TURNS) if trace.uid not in same
            )
