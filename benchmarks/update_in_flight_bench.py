"""What a weight update does to the generations in flight: `update_in_flight=drain` against `continue`.

Short async training runs (`AglTrainer.fit()` on the CPU, as tests/train/test_fit_async.py builds its run:
`tests.train.fit_runs.async_overrides` and `fit`, 4 groups of 2 rollouts in flight, 2 trained per step), one per
mode and `--repeats` times, alternated (drain, continue, drain, ...), in the same invocation and against the same
vLLM: the real-vocabulary tiny model (examples/word_lookup's `fresh_run`: dev mode, `--enable-scale-out`, so every
call goes through the proxy's token chain). The agent is `tests.train.agents:SdkLowercaseAgent`: one call through
the unmodified OpenAI SDK (two retries) asking for `--tokens` tokens with `ignore_eos`, so a call generates for
seconds and a weight update lands in the middle of some. Every run sets
`algorithm.rollout_correction.rollout_is=token` (verl's default threshold, 2.0) and a drain bound of
`--drain-timeout` (0.05 s), so with `drain` the calls still generating at an update are cancelled (503, the SDK
retries from scratch) and with `continue` they park and go on from their sampled ids on the new weights. Each run
trains on its own fresh copy of the weights (`fit()` loads them into vLLM before its first step).

    .venv/bin/python benchmarks/update_in_flight_bench.py                  # 2 x 2 runs of 6 steps, ~8 min
    .venv/bin/python benchmarks/update_in_flight_bench.py --repeats 1 --tokens 160 --json artifacts/uif.json

What it prints: a table per run (one line per step), then per mode (its runs together) and as continue/drain
(figures "per update" are the mode's totals over its updates, one per step):

- generated: vLLM's `vllm:generation_tokens_total` over the run; answered: the completion tokens
  (`gen_ai.usage.output_tokens`) of the calls that answered (every span not ERROR), read from the store;
  thrown away = generated - answered: tokens vLLM sampled that no answer holds (cancelled calls, and what the
  engine sampled past the point where a parked call's stream was closed); also per update that found calls
  generating (cancelled or parked ones: by the step schedule, steps 3 to the one before the last);
- re-prefilled: vLLM's `vllm:prompt_tokens_total` less the answered calls' prompt tokens: prompts computed again
  (a retried call's prompt; a continuation's prompt + kept ids);
- cancelled / parked: the trainer's `rollout/proxy_calls_cancelled_at_update` / `_parked_at_update`;
  kept: the proxy's `agl_proxy_continued_tokens_kept_total` (ids sampled before an update and not generated
  again); two-version answers: answered calls whose `agl.choices[i].segments` name more than one version;
- pause: from the proxy's `paused_at` to the first poll of `/proxy/state` (every 0.1 s) that finds it resumed,
  i.e. the time new and parked calls wait (overstated by up to one poll); update: the trainer's
  `timing_s/old_log_prob + update_actor + update_weights`, the part of the pause spent on the weights;
- step: `timing_s/agl_step`; reward: `rollout/reward_mean` per step (the share of lowercase-word tokens);
- `rollout_corr/*` (verl's names): `rollout_is_mean` (token importance weight min(pi_old/pi_rollout, 2)),
  `rollout_is_ratio_fraction_high` (share of tokens truncated at 2); `training/off_policy/*`: token staleness
  (trained version - sampling version) and the share of rows and tokens that cross versions.

Medians over steps where a figure is noisy; the machine's load (`uptime`) before each run and at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agl_store import call_span  # noqa: E402
from agl_train.command.services import environment  # noqa: E402
from agl_train.command.steps import StepPrinter  # noqa: E402
from examples.lowercase_words.train import running_proxy  # noqa: E402
from examples.word_lookup.train import fresh_run  # noqa: E402
from tests.train.fit_runs import BATCH, async_overrides, fit, unique_tasks  # noqa: E402

MODES = ("drain", "continue")
POLL_S = 0.1
UPDATE_TIMERS = ("timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights")
IS_MEAN, IS_TRUNCATED = "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_ratio_fraction_high"
STALENESS = (
    "training/off_policy/token_staleness/mean",
    "training/off_policy/cross_version_row_fraction",
    "training/off_policy/cross_version_token_fraction",
)


@dataclass
class Measured:
    """One mode's run: the trainer's per-step metrics and the counts read around it."""

    mode: str
    label: str  # the mode and the run's number, `drain #1`
    load: str  # `uptime` as the run started
    history: list[dict[str, float]]
    wall_s: float
    generated: float  # vLLM's generation tokens over the run
    prefilled: float  # vLLM's prompt tokens over the run
    answered: int = 0  # completion tokens of the calls that answered
    answered_prompts: int = 0
    calls: int = 0
    error_calls: int = 0
    two_version_answers: int = 0
    proxy: dict[str, float] = field(default_factory=dict)
    pauses_s: list[float] = field(default_factory=list)

    @property
    def updates(self) -> int:
        return len(self.history)

    def total(self, key: str) -> float:
        return sum(m.get(key, 0.0) for m in self.history)

    def per_step(self, key: str) -> list[float]:
        return [m.get(key, float("nan")) for m in self.history]


def scrape(url: str, names: Sequence[str]) -> dict[str, float]:
    """Prometheus counters at `url`, each summed over its label sets (vLLM labels by engine and model)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


@contextmanager
def watching_pauses(proxy_url: str) -> Iterator[list[float]]:
    """The length of each weight-update pause of the proxy while in the block, polled from its
    `/proxy/state` in a thread (filled in as the pauses end)."""
    pauses_s: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=_follow_pauses, args=(proxy_url.rstrip("/") + "/proxy/state", pauses_s, stop), daemon=True
    )
    thread.start()
    try:
        yield pauses_s
    finally:
        stop.set()
        thread.join()


def _follow_pauses(url: str, pauses_s: list[float], stop: threading.Event) -> None:
    paused_at: float | None = None
    while not stop.wait(POLL_S):
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                state = json.load(response)
        except OSError:
            continue  # a busy proxy: the next poll tells
        if state["paused"] and state.get("reason") == "weight update":
            paused_at = state["paused_at"]  # the proxy's time.time(): same clock, same machine
        elif paused_at is not None:
            pauses_s.append(time.time() - paused_at)
            paused_at = None


async def read_calls(db_path: Path, measured: Measured) -> None:
    """The run's LLM-call spans, every attempt of every rollout: what the calls that answered hold."""
    from agl_store.sqlite import SQLiteStore

    store = await SQLiteStore(str(db_path)).open()
    try:
        for rollout in await store.query_rollouts():
            for span in await store.query_spans(rollout.rollout_id, name=call_span.NAME):
                measured.calls += 1
                if span.status.status_code == "ERROR":
                    measured.error_calls += 1
                    continue
                attributes = span.attributes
                measured.answered += int(attributes.get(call_span.OUTPUT_TOKENS) or 0)
                measured.answered_prompts += int(attributes.get(call_span.INPUT_TOKENS) or 0)
                choices = attributes.get(call_span.CHOICES) or []
                if any(len({version for version, _ in choice.get("segments") or []}) > 1 for choice in choices):
                    measured.two_version_answers += 1
    finally:
        await store.close()


VLLM_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
PROXY_COUNTERS = (
    "agl_proxy_continued_calls_total",
    "agl_proxy_continued_tokens_kept_total",
    "agl_proxy_cancelled_calls_total",
)


def run_mode(mode: str, label: str, model_path: Path, address: str, out: Path, args: argparse.Namespace) -> Measured:
    """One async training run with `update_in_flight=mode`, and what vLLM, the proxy and the store counted."""
    out.mkdir(parents=True, exist_ok=True)
    changes = [
        f"agentlightning.update_in_flight={mode}",
        # As test_fit_async.py: short enough that `drain` cancels what still generates.
        f"agentlightning.update_drain_timeout_seconds={args.drain_timeout}",
        f"actor_rollout_ref.rollout.response_length={args.tokens}",
        # The row budget caps a call's tokens too (docs/trainer.md, "Sampling the actor assumes").
        f"agentlightning.trace_aggregator.trajectory_max_response_length={args.tokens}",
        "actor_rollout_ref.actor.optim.lr=0.03",  # examples/word_lookup's rate for this model
        "algorithm.rollout_correction.rollout_is=token",  # verl's default threshold, 2.0
        "trainer.val_before_train=false",  # validation's calls would blur vLLM's token counts
        "trainer.test_freq=-1",
    ]
    vllm_metrics = f"http://{address}/metrics"
    load = uptime()
    before = scrape(vllm_metrics, VLLM_COUNTERS)
    started = time.monotonic()
    # The agents are subprocesses that import `tests.train.agents`; AGENT_MAX_TOKENS makes their answers long.
    variables = {"AGENT_MAX_TOKENS": str(args.tokens), "PYTHONPATH": str(REPO)}
    with environment(variables), running_proxy(out) as proxy_url, watching_pauses(proxy_url) as pauses_s:
        config = async_overrides(model_path, proxy_url, out, changes)
        with StepPrinter(out / "metrics.jsonl", print_lines=True):  # progress: fit's own printer is silent
            run = fit(config, out, unique_tasks(args.steps * BATCH), unique_tasks(2), address)
        wall_s = time.monotonic() - started
        time.sleep(1.0)  # vLLM's frontend gets the engine's counts once a step; let the last arrive
        proxy = scrape(proxy_url.rstrip("/") + "/metrics", PROXY_COUNTERS)
    after = scrape(vllm_metrics, VLLM_COUNTERS)
    measured = Measured(
        mode=mode,
        label=label,
        load=load,
        history=run.history,
        wall_s=wall_s,
        generated=after[VLLM_COUNTERS[0]] - before[VLLM_COUNTERS[0]],
        prefilled=after[VLLM_COUNTERS[1]] - before[VLLM_COUNTERS[1]],
        proxy=proxy,
        pauses_s=pauses_s,
    )
    asyncio.run(read_calls(run.db_path, measured))
    del run
    gc.collect()  # the finished trainer's model and optimizer, before the next run builds its own
    return measured


def together(mode: str, runs: Sequence[Measured]) -> Measured:
    """A mode's runs as one: steps and pauses one after the other, counts summed."""
    mine = [m for m in runs if m.mode == mode]
    merged = Measured(
        mode=mode,
        label=mode,
        load="",
        history=[step for m in mine for step in m.history],
        wall_s=sum(m.wall_s for m in mine),
        generated=sum(m.generated for m in mine),
        prefilled=sum(m.prefilled for m in mine),
        pauses_s=[p for m in mine for p in m.pauses_s],
    )
    for name in ("answered", "answered_prompts", "calls", "error_calls", "two_version_answers"):
        setattr(merged, name, sum(getattr(m, name) for m in mine))
    merged.proxy = {name: sum(m.proxy[name] for m in mine) for name in PROXY_COUNTERS}
    return merged


def median(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]
    return statistics.median(finite) if finite else float("nan")


def figures(m: Measured) -> dict[str, float]:
    """The comparison's lines for one run."""
    u = m.updates
    # Only some updates find calls generating (by the schedule, steps 3 to the one before the last): the
    # figures per such update say what one costs where the setting matters.
    caught = sum(
        step.get("rollout/proxy_calls_cancelled_at_update", 0.0) + step.get("rollout/proxy_calls_parked_at_update", 0.0)
        > 0
        for step in m.history
    )
    update_s = [sum(step.get(key, 0.0) for key in UPDATE_TIMERS) for step in m.history]
    return {
        "updates (steps)": u,
        "tokens generated (vLLM)": m.generated,
        "tokens in answers": m.answered,
        "tokens thrown away per update": (m.generated - m.answered) / u,
        "updates that found calls generating": caught,
        "tokens thrown away per such update": (m.generated - m.answered) / caught if caught else float("nan"),
        "prompt tokens re-prefilled per update": (m.prefilled - m.answered_prompts) / u,
        "calls cancelled per update": m.total("rollout/proxy_calls_cancelled_at_update") / u,
        "calls parked per update": m.total("rollout/proxy_calls_parked_at_update") / u,
        "tokens kept per update (proxy)": m.proxy["agl_proxy_continued_tokens_kept_total"] / u,
        "tokens kept per such update": m.proxy["agl_proxy_continued_tokens_kept_total"] / caught if caught else 0.0,
        "answers sampled by two versions": m.two_version_answers,
        "failed calls (ERROR spans)": m.error_calls,
        "rollouts succeeded": m.total("rollout/n_done"),
        "rollouts failed or timed out": m.total("rollout/n_failed") + m.total("rollout/n_timed_out"),
        "pause s, median (polled)": median(m.pauses_s),
        "update s, median (trainer timers)": median(update_s),
        "step s, median (timing_s/agl_step)": median(m.per_step("timing_s/agl_step")),
        "run wall s (runs summed)": m.wall_s,
        "reward_mean, mean over steps": statistics.fmean(m.per_step("rollout/reward_mean")),
        "rollout_is_mean, median": median(m.per_step(IS_MEAN)),
        "rollout_is truncated share, median": median(m.per_step(IS_TRUNCATED)),
        "token staleness mean, median": median(m.per_step(STALENESS[0])),
        "cross-version token fraction, max": max(m.per_step(STALENESS[2]), default=float("nan")),
    }


def show(value: float) -> str:
    if value != value:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:.3f}"


def report(runs: list[Measured]) -> None:
    print(
        "\n## per step (reward_mean, calls parked / cancelled at the update, pause s, step s, "
        "rollout_is_mean, truncated share, token staleness mean, cross-version token fraction)"
    )
    for m in runs:
        print(f"\n{m.label} ({m.wall_s:.0f} s; at its start: {m.load}):\n")
        columns = ("reward_mean", "parked", "cancelled", "pause s", "step s", "is_mean", "truncated", "staleness")
        print("| step | " + " | ".join(columns) + " | cross-version |")
        print("| --- " * (len(columns) + 2) + "|")
        for i, step in enumerate(m.history):
            pause = m.pauses_s[i] if i < len(m.pauses_s) else float("nan")
            cells = [
                step.get("rollout/reward_mean", float("nan")),
                step.get("rollout/proxy_calls_parked_at_update", float("nan")),
                step.get("rollout/proxy_calls_cancelled_at_update", float("nan")),
                pause,
                step.get("timing_s/agl_step", float("nan")),
                step.get(IS_MEAN, float("nan")),
                step.get(IS_TRUNCATED, float("nan")),
                step.get(STALENESS[0], float("nan")),
                step.get(STALENESS[2], float("nan")),
            ]
            print(f"| {int(step['step'])} | " + " | ".join(show(c) for c in cells) + " |")
    keys = sorted({key for m in runs for step in m.history for key in step if key.startswith("rollout_corr/")})
    print(f"\nverl's rollout_corr/* names in the history: {', '.join(k.removeprefix('rollout_corr/') for k in keys)}")
    if set(MODES) <= {m.mode for m in runs}:
        drain, cont = figures(together("drain", runs)), figures(together("continue", runs))
        print(f"\n## drain against continue (each mode's {len(runs) // 2} runs together)\n")
        print("| figure | drain | continue | continue/drain |")
        print("| --- | --- | --- | --- |")
        for key, d in drain.items():
            c = cont[key]
            ratio = show(c / d) if d and d == d and c == c else "-"
            print(f"| {key} | {show(d)} | {show(c)} | {ratio} |")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


@contextmanager
def announced(message: str) -> Iterator[None]:
    started = time.monotonic()
    print(f"[bench] {message}", flush=True)
    yield
    print(f"[bench] {message}: done in {time.monotonic() - started:.0f} s", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="training steps (= weight updates) per mode")
    parser.add_argument("--tokens", type=int, default=192, help="tokens each call generates (ignore_eos)")
    parser.add_argument("--drain-timeout", type=float, default=0.05, help="agentlightning.update_drain_timeout_seconds")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, alternated")
    parser.add_argument("--modes", default=",".join(MODES), help="update_in_flight settings, run in this order")
    parser.add_argument("--out", type=Path, default=REPO / "artifacts" / "update_in_flight_bench")
    parser.add_argument("--json", type=Path, default=None, help="also write every run's metrics here")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    print(f"[bench] load before: {uptime()}", flush=True)
    runs: list[Measured] = []
    with fresh_run(out) as (model_path, address):  # empties `out`, serves a copy of the real-vocabulary model
        for repeat in range(1, args.repeats + 1):
            for mode in args.modes.split(","):
                label = f"{mode} #{repeat}"
                with announced(f"update_in_flight={label}: {args.steps} steps, {args.tokens}-token calls"):
                    runs.append(run_mode(mode, label, model_path, address, out / f"{mode}-{repeat}", args))
    print(f"[bench] load after: {uptime()}", flush=True)
    report(runs)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(m) for m in runs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
