"""A chaos run: the word_lookup example (examples/word_lookup) trained on the CPU while its parts
are killed, each once, at a random point of a random step.

    python -m benchmarks.chaos_run [--steps 6] [--faults agent,store,proxy,vllm,trainer] [--seed 0]
        [--store server|embedded] [--out DIR]

The parts run as separate processes, as in a real deployment: vLLM (dev mode, on a copy of the
tiny model), `agl store serve` on a SQLite file, `agl proxy serve --store-url` (which serves the
store's routes to the trainer too), and the trainer (`AglTrainer.fit()` through `run_ppo_on_cpu`,
a checkpoint every step, `trainer.resume_mode=auto`). `--store embedded` runs no store server:
the proxy keeps the file itself (`--db`). Faults, each SIGKILL:

- `agent`: one agent subprocess of the trainer's local runner;
- `store`: the store server, restarted on the same port and database file (not with `--store embedded`);
- `proxy`: the proxy (and with `--store embedded` its store), restarted on the same port (and file);
- `vllm`: the vLLM server, restarted on the same port (it serves the model's base weights until
  the trainer's next weight update);
- `trainer`: the trainer process, restarted with the same command (it resumes from its last
  checkpoint).

A trainer that exits with an error (a part it needs went away) is restarted with the same
command too, at most `MAX_LAUNCHES` times. At the end the run checks, from the store and the
rows the trainer dumped (`trainer.rollout_data_dir`): every step was trained, no group was trained
in two steps, no rollout had two attempts running at once, every succeeded training rollout has
its spans, no agent outlived the trainer that started it, and no acknowledged span was lost
(benchmarks/chaos_acks.py: the proxy's count of spans the store acknowledged, scraped before each
store or proxy kill and at the end, against the spans in the file). It prints one JSON object: the
faults (when, at which step, the time to the next trained step and the time lost against the
median step), the launches, the checks. Everything it starts is stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos_acks import AckLedger

REPO = Path(__file__).resolve().parents[1]
FAULTS = ("agent", "store", "proxy", "vllm", "trainer")
MAX_LAUNCHES = 8
READY_TIMEOUT_S = 300.0
AGENT_MODULE = "agl_train.runner.launch"
AGENT_CLASS = "examples.word_lookup.agent:WordLookupAgent"
MAX_FAULT_DELAY_S = 8.0
"""A fault fires this long at most after its step begins (the previous step's metrics line)."""


@dataclass
class Fault:
    kind: str
    step: int  # fires while this step runs
    delay_s: float
    fired_at: float | None = None
    fired_in_step: int | None = None  # later than `step` when an earlier fault's recovery took that step
    detail: str = ""
    recovered_s: float | None = None  # from the fault to the next step trained
    lost_s: float | None = None  # recovered_s less the median step (`timing_s/agl_step` of steps no fault hit)


@dataclass
class Run:
    out: Path
    steps: int
    model: Path
    vllm_port: int
    proxy_port: int
    store_port: int | None  # None: the proxy's embedded store
    acks: AckLedger
    launches: int = 0
    step_done_at: dict[int, float] = field(default_factory=dict)
    step_seconds: dict[int, float] = field(default_factory=dict)  # the trainer's own `timing_s/agl_step`
    vllm: subprocess.Popen[bytes] | None = None
    proxy: subprocess.Popen[bytes] | None = None
    store: subprocess.Popen[bytes] | None = None
    trainer: subprocess.Popen[bytes] | None = None
    orphans: list[int] = field(default_factory=list)


def free_port() -> int:
    from examples.tiny_vllm.vllm_server import free_port as free

    return free()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def wait_http(url: str, process: subprocess.Popen[bytes], what: str) -> None:
    """Until `url` answers 200; RuntimeError when `process` exits first or the bound passes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} is not serving {url} (exit code {process.poll()})")
        time.sleep(0.5)


def start_vllm(run: Run) -> None:
    from examples.tiny_vllm.tiny_model import SERVED_MODEL_NAME
    from examples.tiny_vllm.vllm_server import vllm_command

    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "VLLM_SERVER_DEV_MODE": "1"}
    with open(run.out / "vllm.log", "ab") as log:
        run.vllm = subprocess.Popen(
            vllm_command(run.model, run.vllm_port, SERVED_MODEL_NAME), stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    wait_http(f"http://127.0.0.1:{run.vllm_port}/v1/models", run.vllm, "vLLM")


def start_store(run: Run) -> None:
    command = [sys.executable, "-m", "agl_store.cli", "store", "serve", "--db", str(run.out / "agl.db")]
    with open(run.out / "store.log", "ab") as log:
        run.store = subprocess.Popen(
            [*command, "--port", str(run.store_port)], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
            start_new_session=True,
        )  # fmt: skip
    wait_http(f"http://127.0.0.1:{run.store_port}/health", run.store, "the store server")


def start_proxy(run: Run) -> None:
    (run.out / "models.yaml").write_text("model_list: []\n")
    store = ["--db", str(run.out / "agl.db")] if run.store_port is None else ["--store-url", store_url(run)]
    command = [
        sys.executable, "-m", "agl_store.cli", "proxy", "serve", "--config", str(run.out / "models.yaml"),
        *store, "--port", str(run.proxy_port), "--logprobs",
    ]  # fmt: skip
    run.acks.proxy_starting()
    with open(run.out / "proxy.log", "ab") as log:
        run.proxy = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    wait_http(f"http://127.0.0.1:{run.proxy_port}/health", run.proxy, "the proxy")


def store_url(run: Run) -> str:
    return f"http://127.0.0.1:{run.store_port}"


def probe_acks(run: Run, before: str) -> str:
    """The acknowledged-span probe (benchmarks/chaos_acks.py); its outcome in words."""
    try:
        probe = run.acks.probe(f"http://127.0.0.1:{run.proxy_port}", before)
    except (OSError, StopIteration, ValueError) as exc:  # the proxy is not answering (an earlier fault)
        return f"acknowledged spans not probed ({exc!r})"
    return f"{probe.exported} spans acknowledged to this proxy, {probe.in_file} call spans in the file"


def start_trainer(run: Run) -> None:
    run.launches += 1
    args = {"out": str(run.out), "steps": run.steps, "model": str(run.model)}
    args |= {"vllm": f"127.0.0.1:{run.vllm_port}", "proxy": f"http://127.0.0.1:{run.proxy_port}"}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env["VERL_FILE_LOGGER_PATH"] = str(run.out / f"metrics-{run.launches}.jsonl")  # verl truncates its file
    env = {key: value for key, value in env.items() if key not in ("MASTER_ADDR", "MASTER_PORT")}
    with open(run.out / f"trainer-{run.launches}.log", "wb") as log:
        run.trainer = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.chaos_run", "--trainer", json.dumps(args)],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
        )  # fmt: skip


def kill_group(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    process.wait()


def processes() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, command line) of every live process this user can read (a zombie is dead)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, parent_field = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            if state in ("Z", "X"):
                continue
            parent = int(parent_field)
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        found[int(entry.name)] = (parent, command)
    return found


def agents_of(pid: int) -> list[int]:
    """The agent processes descended from `pid`."""
    table = processes()

    def descends(candidate: int) -> bool:
        seen = 0
        while candidate > 1 and seen < 64:
            if candidate == pid:
                return True
            candidate, seen = table.get(candidate, (0, ""))[0], seen + 1
        return False

    return [p for p, (_, command) in table.items() if AGENT_MODULE in command and descends(p)]


def stray_agents() -> list[int]:
    """word_lookup agents whose trainer is gone (reparented to init)."""
    return [p for p, (parent, command) in processes().items() if AGENT_CLASS in command and parent == 1]


def steps_done(run: Run) -> int:
    """The highest step any launch logged as trained; notes when each step was first trained."""
    best = 0
    for path in run.out.glob("metrics-*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line the killed trainer was writing
            if "training/global_step" in record.get("data", {}):
                step = int(record["step"])
                run.step_done_at.setdefault(step, time.monotonic())
                run.step_seconds[step] = float(record["data"].get("timing_s/agl_step", 0.0))
                best = max(best, step)
    # A trainer killed after its checkpoint and before its metrics line trained the step all the same.
    return max(best, *checkpointed(run.out), 0)


def checkpointed(out: Path) -> list[int]:
    """The steps whose checkpoint verl finished (its tracker file names the latest)."""
    tracker = out / "checkpoints" / "latest_checkpointed_iteration.txt"
    if not tracker.exists() or not tracker.read_text().strip().isdigit():
        return []
    latest = int(tracker.read_text().strip())
    return [step for step in range(1, latest + 1) if (out / "checkpoints" / f"global_step_{step}").is_dir()]


def inject(run: Run, fault: Fault) -> None:
    fault.fired_at = time.monotonic()
    if fault.kind == "agent":
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and run.trainer is not None:
            agents = agents_of(run.trainer.pid)
            if agents:
                victim = random.choice(agents)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
                fault.detail = f"killed agent {victim} of {len(agents)} running"
                return
            time.sleep(0.1)
        fault.detail = "no agent was running within 60 s"
    elif fault.kind == "trainer":
        assert run.trainer is not None
        agents = agents_of(run.trainer.pid)
        run.trainer.send_signal(signal.SIGKILL)
        run.trainer.wait()
        time.sleep(2.0)  # the kernel's parent-death signal reaches the agents at once; give them a moment
        run.orphans += [pid for pid in agents if pid in processes()]
        fault.detail = f"killed the trainer with {len(agents)} agents running; {len(run.orphans)} outlived it"
        start_trainer(run)
    elif fault.kind == "store":
        acked = probe_acks(run, "kill store")
        kill_group(run.store)
        start_store(run)
        fault.detail = f"store server back after {time.monotonic() - fault.fired_at:.1f} s; {acked}"
    elif fault.kind == "proxy":
        acked = probe_acks(run, "kill proxy")
        kill_group(run.proxy)
        start_proxy(run)
        what = "proxy and store" if run.store_port is None else "proxy"
        fault.detail = f"{what} back after {time.monotonic() - fault.fired_at:.1f} s; {acked}"
    elif fault.kind == "vllm":
        kill_group(run.vllm)
        start_vllm(run)
        fault.detail = f"vLLM back after {time.monotonic() - fault.fired_at:.1f} s"


def plan_faults(kinds: list[str], steps: int, rng: random.Random) -> list[Fault]:
    """Each fault during a distinct random step after the first (as far as there are steps)."""
    choices = list(range(2, steps + 1))
    rng.shuffle(choices)
    faults = [
        Fault(kind, choices[i % len(choices)], round(rng.uniform(0, MAX_FAULT_DELAY_S), 1))
        for i, kind in enumerate(kinds)
    ]
    return sorted(faults, key=lambda f: (f.step, f.delay_s))


def supervise(run: Run, faults: list[Fault], timeout_s: float) -> bool:
    """Run until the trainer exits 0 after the last step (True) or the time is up (False)."""
    deadline = time.monotonic() + timeout_s
    pending = list(faults)
    step_started: dict[int, float] = {1: time.monotonic()}
    while time.monotonic() < deadline:
        done = steps_done(run)
        step_started.setdefault(done + 1, time.monotonic())
        assert run.trainer is not None
        code = run.trainer.poll()
        if code == 0 and done >= run.steps:
            return True
        if code is not None:
            if run.launches >= MAX_LAUNCHES:
                return False
            start_trainer(run)  # died of a fault it could not ride out: the same command resumes it
        if pending and done + 1 >= pending[0].step:
            fault = pending[0]
            if time.monotonic() >= step_started[done + 1] + fault.delay_s:
                pending.pop(0)
                fault.fired_in_step = done + 1
                inject(run, fault)
        time.sleep(0.2)
    return False


def account(run: Run, faults: list[Fault]) -> None:
    """Each fault's time to the next trained step, and what it lost against the median step."""
    times = sorted(run.step_done_at.items())
    hit = {fault.fired_in_step for fault in faults}
    clean = [seconds for step, seconds in run.step_seconds.items() if step not in hit] or list(
        run.step_seconds.values()
    )
    median = statistics.median(clean) if clean else 0.0
    for fault in faults:
        if fault.fired_at is None:
            continue
        after = [at for _, at in times if at > fault.fired_at]
        if after:
            fault.recovered_s = round(after[0] - fault.fired_at, 1)
            fault.lost_s = round(max(fault.recovered_s - median, 0.0), 1)


async def store_checks(db: Path) -> dict[str, Any]:
    """What the store says: rollouts with overlapping attempts, succeeded training rollouts without spans."""
    from agl_store.sqlite import SQLiteStore

    overlapping, without_spans = [], []
    async with SQLiteStore(str(db)) as store:
        for rollout in await store.query_rollouts(mode="train"):
            attempts = sorted(await store.query_attempts(rollout.rollout_id), key=lambda a: a.start_time)
            for first, second in zip(attempts, attempts[1:], strict=False):
                if first.end_time is None or first.end_time > second.start_time:
                    overlapping.append(rollout.rollout_id)
            if rollout.status == "succeeded" and not await store.query_spans(rollout.rollout_id, "latest"):
                without_spans.append(rollout.rollout_id)
    return {"rollouts_with_overlapping_attempts": overlapping, "succeeded_rollouts_without_spans": without_spans}


def trained_twice(rows: Path) -> list[str]:
    """Groups (uids) whose rows the final run trained in more than one step."""
    steps_of: dict[str, set[int]] = {}
    for path in rows.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            steps_of.setdefault(json.loads(line)["uid"], set()).add(int(path.stem))
    return sorted(uid for uid, steps in steps_of.items() if len(steps) > 1)


def trainer_main(args: dict[str, Any]) -> None:
    """One launch of the trainer (the same command every time): word_lookup's run, saved every step."""
    import torch

    from agl_train.verl_glue.config import compose_config
    from agl_train.verl_glue.cpu_run import run_ppo_on_cpu
    from examples.word_lookup import train as word_lookup

    torch.set_num_threads(1)
    out, steps, model = Path(args["out"]), int(args["steps"]), Path(args["model"])
    extra = [
        "trainer.save_freq=1",
        "trainer.resume_mode=auto",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        f"trainer.rollout_data_dir={out / 'rows'}",
        "agentlightning.rollout_timeout_seconds=60",
        "agentlightning.update_drain_timeout_seconds=10",
    ]
    config = compose_config(word_lookup.overrides(model, args["proxy"], steps, out, "trajectory", extra=extra))
    tasks, val_tasks = word_lookup.tasks(4 * steps), word_lookup.tasks(4, offset=1)
    run_ppo_on_cpu(config, tasks, val_tasks, [args["vllm"]], out / "weights")


@contextlib.contextmanager
def parts(run: Run) -> Iterator[None]:
    try:
        start_vllm(run)
        if run.store_port is not None:
            start_store(run)
        start_proxy(run)
        start_trainer(run)
        yield
        probe_acks(run, "end")
    finally:
        for process in (run.trainer, run.proxy, run.store, run.vllm):
            kill_group(process)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--store", choices=("server", "embedded"), default="server", help="a store server, or the proxy's"
    )
    parser.add_argument("--out", type=Path, default=REPO / "artifacts" / "chaos")
    parser.add_argument("--timeout", type=float, default=2400.0, help="seconds for the whole run")
    parser.add_argument("--trainer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trainer:
        trainer_main(json.loads(args.trainer))
        return 0
    kinds = [kind for kind in args.faults.split(",") if kind]
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown:
        parser.error(f"unknown fault {unknown[0]!r}; faults are {', '.join(FAULTS)}")
    if args.store == "embedded" and "store" in kinds:
        parser.error("--faults store needs --store server (the embedded store dies with the proxy)")
    if args.steps < 2:
        parser.error("--steps must be at least 2 (faults fire from step 2 on)")
    import shutil

    from examples.tiny_vllm.tiny_model import DEFAULT_DIR
    from examples.tiny_vllm.vllm_server import build_tiny_model

    random.seed(args.seed)
    out: Path = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    model = out / "model"
    shutil.copytree(build_tiny_model(DEFAULT_DIR), model)
    store_port = free_port() if args.store == "server" else None
    run = Run(out, args.steps, model, free_port(), free_port(), store_port, AckLedger(out / "agl.db"))
    faults = plan_faults(kinds, args.steps, random.Random(args.seed))
    started = time.monotonic()
    with parts(run):
        completed = supervise(run, faults, args.timeout)
    account(run, faults)
    checks = asyncio.run(store_checks(out / "agl.db"))
    checks["groups_trained_twice"] = trained_twice(out / "rows")
    checks["agents_outliving_their_trainer"] = run.orphans + stray_agents()
    checks["acknowledged_spans_lost"] = run.acks.lost()
    report = {
        "completed": completed and checkpointed(out) == list(range(1, args.steps + 1)),
        "steps_logged": sorted(run.step_done_at),
        "steps_checkpointed": checkpointed(out),
        "steps": args.steps,
        "median_step_s": round(statistics.median(run.step_seconds.values()), 1) if run.step_seconds else None,
        "wall_s": round(time.monotonic() - started, 1),
        "launches": run.launches,
        "faults": [
            asdict(fault) | {"fired_at": None if fault.fired_at is None else round(fault.fired_at - started, 1)}
            for fault in faults
        ],
        "ack_probes": [asdict(probe) for probe in run.acks.probes],
        "checks": checks,
        "ok": completed and not any(checks.values()),
    }
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
