"""Warnings about a training step, from its metrics: what a normal-looking step line does not show.

- no learning signal: every group's rollouts got equal rewards for `NO_SIGNAL_STEPS` steps running, so
  every advantage is 0 and nothing is learned;
- `training/rollout_probs_diff_max` over `PROBS_DIFF_LIMIT`: vLLM sampled from other probabilities than the
  trainer scores (grammar-constrained sampling, or weights out of sync);
- most rows dropped before the update;
- failed rollouts, quoting the first failure's error (read from the store by `first_failure`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

NO_SIGNAL_STEPS = 2
PROBS_DIFF_LIMIT = 0.5
"""~0 when vLLM samples from the actor's own distribution; the trainer's probability of a sampled token can
differ from vLLM's by nearly 1 only when vLLM sampled under constraints the trainer does not see."""
MOST_ROWS = 0.5
EPSILON = 1e-9


class StepWarnings:
    """Called with each training step's metrics, returns that step's warnings. `first_failure` reads
    the error of the run's first failed rollout (None while there is none)."""

    def __init__(self, first_failure: Callable[[], str | None] = lambda: None) -> None:
        self.first_failure = first_failure
        self._no_signal_steps = 0
        self._failure_quoted = False

    def __call__(self, m: Mapping[str, float]) -> list[str]:
        return [w for w in (self._no_signal(m), _probs_diff(m), _rows_dropped(m), self._failed(m)) if w]

    def _no_signal(self, m: Mapping[str, float]) -> str | None:
        equal = m.get("rollout/reward_min") == m.get("rollout/reward_max") or (
            abs(m.get("critic/advantages/max", 1.0)) < EPSILON and abs(m.get("critic/advantages/min", 1.0)) < EPSILON
        )
        self._no_signal_steps = self._no_signal_steps + 1 if equal else 0
        if self._no_signal_steps < NO_SIGNAL_STEPS:
            return None
        return (
            f"no learning signal: every group's rollouts got equal rewards for {self._no_signal_steps} steps "
            f"(reward {m.get('rollout/reward_mean', float('nan')):.3f}), so every advantage is 0 and the update "
            "changes nothing. Give partial credit so that rollouts of one task differ, raise rollout.n or the "
            "temperature, or check the agent's reward."
        )

    def _failed(self, m: Mapping[str, float]) -> str | None:
        failed = int(m.get("rollout/n_failed", 0) + m.get("rollout/n_timed_out", 0))
        if not failed:
            return None
        total = failed + int(m.get("rollout/n_done", 0))
        message = f"{failed} of {total} rollouts failed or timed out (dropped from the update)"
        if not self._failure_quoted and (error := self.first_failure()):
            self._failure_quoted = True
            message += f"; the first failure: {error.strip()[-1500:]}"
        return message


def _probs_diff(m: Mapping[str, float]) -> str | None:
    diff = m.get("training/rollout_probs_diff_max")
    if diff is None or diff <= PROBS_DIFF_LIMIT:
        return None
    return (
        f"training/rollout_probs_diff_max is {diff:.5g} (about 0 when vLLM samples from the trained policy): vLLM "
        "sampled some tokens from other probabilities than the trainer scores. The usual cause is grammar-constrained "
        "sampling (a forced `tool_choice`, `response_format` or guided decoding: vLLM masks tokens the trainer does "
        "not), else the weights vLLM serves are not the actor's. Such updates are off-policy."
    )


def _rows_dropped(m: Mapping[str, float]) -> str | None:
    rows, kept = m.get("training/n_rows", 0.0), m.get("training/n_update_rows", 0.0)
    if m.get("rollout/n_done", 0.0) == 0 or (rows > 0 and kept >= MOST_ROWS * rows):
        return None
    return (
        f"most rows dropped: {int(kept)} of {int(rows)} rows trained. See training/n_sample_dropped/* (prompts over "
        "agentlightning.trace_aggregator.trajectory_max_prompt_length), training/n_rows_off_sampling and "
        "training/n_rollouts_without_rows / _without_reward (rollouts without a model call through the proxy, "
        "or without a reward)."
    )
