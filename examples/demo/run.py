"""`./scripts/agl demo`: vLLM (real vocabulary, token endpoints) → `agl proxy serve` → a multi-turn tool agent.

    ./scripts/agl demo [--rollouts 3] [--no-wait] [--db PATH] [--backend URL [--model NAME]] [--tokenizer PATH]

Starts vLLM on the real-vocabulary tiny model (`examples/tiny_vllm/real_vocab.py`, built here when missing) with
`--enable-scale-out`, so the proxy serves chat calls token in, token out; starts `agl proxy serve` with its
embedded SQLite store and web view (told the model's tokenizer, so the token view shows text); runs the agent
(`agent.py`) on each rollout's base URL; prints each rollout's calls and training row (`report.py`) and the token
view's address; serves until Ctrl-C or SIGTERM, then stops the proxy and vLLM. The model is random, so the answers
are noise; the token ids are real. Nothing is downloaded. It is an example, not a command of the installed `agl`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from agl_store import LightningStore, ProxyLLM, reward_span
from agl_store.client import LightningStoreClient
from agl_train.core.traces import RolloutTrace, read_rollout
from examples.quickstart.run import agl_proxy_serve

from .agent import TASKS, run_agent
from .report import Decode, rollout_lines, summary, trainer_settings, training_rows

# What the processes the demo starts need to stay offline (and quiet about it).
CHILD_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# vLLM's bytecode written into .venv even where PYTHONDONTWRITEBYTECODE is set (an empty value unsets it): its next
# start takes half the time (scripts/setup.sh demo compiles nothing ahead).
VLLM_ENV = {**CHILD_ENV, "PYTHONDONTWRITEBYTECODE": ""}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SPANS_TIMEOUT_S = 10.0  # the proxy exports spans in the background, batched every 20 ms


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1 (a demo of no rollout shows nothing)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="./scripts/agl demo",
        description="vLLM with the real-vocabulary tiny model, `agl proxy serve` with its store and view, and a "
        "multi-turn tool agent's rollouts: their calls, bridged prompts and training rows; serves until Ctrl-C",
    )
    parser.add_argument("--rollouts", type=positive_int, default=3, help="how many agent rollouts to run (default 3)")
    parser.add_argument("--no-wait", action="store_true", help="stop everything and exit once the rollouts are printed")
    parser.add_argument(
        "--backend", metavar="URL", help="a running vLLM's OpenAI base URL instead of starting the tiny model on vLLM"
    )
    parser.add_argument("--model", help="with --backend: the model name it serves (default: the tiny model's)")
    parser.add_argument("--tokenizer", metavar="PATH", help="tokenizer to show text with (default: the tiny model's)")
    parser.add_argument("--db", metavar="PATH", help="keep the store in this SQLite file (default: a temporary one)")
    parser.add_argument("--port", type=int, default=0, help="the proxy's port (default 0: a free one)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The demo with `build_parser()`'s arguments; 0 also when stopped by Ctrl-C or SIGTERM."""
    from examples.tiny_vllm.real_vocab import QWEN2_5

    # Ctrl-C and SIGTERM stop everything cleanly, also where the shell started the demo with SIGINT ignored.
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.default_int_handler)
    with contextlib.suppress(AttributeError, ValueError):  # the model's noise, printed whatever the terminal
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    try:
        with contextlib.ExitStack() as stack:
            if args.backend:
                backend, model = args.backend, args.model or QWEN2_5.served_model_name
                say(f"vLLM: using {backend} (--backend), model {model}")
            else:
                backend, model = stack.enter_context(real_vocab_model_on_vllm())
            tokenizer = args.tokenizer or default_tokenizer(model)
            db = Path(args.db) if args.db else Path(stack.enter_context(tempfile.TemporaryDirectory())) / "agl.db"
            asyncio.run(serve(args, backend, model, db, tokenizer))
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C, SIGTERM: everything above has stopped
        pass
    say("done")
    return 0


def default_tokenizer(model: str) -> str | None:
    """The tiny model's directory when `model` is it and it is built here; else None (the ids are shown as counts)."""
    from examples.tiny_vllm.real_vocab import QWEN2_5

    directory = QWEN2_5.default_dir
    return str(directory) if model == QWEN2_5.served_model_name and (directory / "tokenizer.json").is_file() else None


@contextlib.contextmanager
def real_vocab_model_on_vllm() -> Iterator[tuple[str, str]]:
    """(base URL, served name) of the real-vocabulary model on a vLLM this process starts and stops.

    `--enable-scale-out` gives vLLM the token-in endpoints (render, generate, derender) through which the
    proxy makes each follow-up prompt from the model's own ids; the hermes tool parser comes with the flags.
    """
    from examples.tiny_vllm.real_vocab import QWEN2_5, is_real_vocab_built
    from examples.tiny_vllm.vllm_server import build_real_vocab_model, running_vllm_server

    directory = QWEN2_5.default_dir
    built = is_real_vocab_built(directory, QWEN2_5)
    state = "reusing" if built else "building (half a minute)"
    say(f"model: {state} {directory} (Qwen2.5's vocabulary and chat template, random weights)")
    model_path = build_real_vocab_model(QWEN2_5)
    log = Path(tempfile.gettempdir()) / "agl-demo-vllm.log"
    say(f"vLLM: starting {QWEN2_5.served_model_name} with the token endpoints (half a minute on a CPU; log {log})")
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        stack.callback(say, "vLLM: stopped")  # also after a failed start or a Ctrl-C while it starts
        server = stack.enter_context(
            running_vllm_server(
                model_path,
                log_path=log,
                served_model_name=QWEN2_5.served_model_name,
                extra_args=("--enable-scale-out",),
                extra_env=VLLM_ENV,
            )
        )
        say(f"vLLM: ready at {server.base_url} ({time.monotonic() - started:.0f} s)")
        stack.callback(say, "vLLM: stopping")
        yield server.base_url, server.model


def load_decoder(path: str | None) -> Decode | None:
    """The model's tokenizer as `Decode`, from its `tokenizer.json` (the `tokenizers` library: no transformers
    import, a second at most); None when there is none, and the rows are shown as counts only."""
    if path is None or not (Path(path) / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


@dataclass(frozen=True)
class Rollout:
    """One finished rollout: its id, and its calls as the trainer reads them."""

    rollout_id: str
    task: str
    trace: RolloutTrace


async def run_rollout(store: LightningStore, proxy_url: str, model: str, task: str) -> Rollout:
    """One rollout: the agent on the rollout's own base URL, its reward recorded, its calls read back."""
    rollout = await store.start_rollout(input={"prompt": task})
    attempt_id = rollout.attempt.attempt_id
    base_url = ProxyLLM(endpoint=proxy_url + "/v1", model=model).get_base_url(rollout.rollout_id, attempt_id)
    result = await run_agent(base_url, model, task)
    await store.add_span(reward_span(rollout.rollout_id, attempt_id, result.reward))
    await store.update_attempt(rollout.rollout_id, attempt_id, status="succeeded")
    return Rollout(rollout.rollout_id, task, await read_calls(store, rollout.rollout_id, result.calls))


async def read_calls(store: LightningStore, rollout_id: str, calls: int) -> RolloutTrace:
    """The rollout read as the trainer reads it, once the proxy's background export has written its `calls` spans."""
    deadline = time.monotonic() + SPANS_TIMEOUT_S
    while True:
        trace = await read_rollout(store, rollout_id)
        if len(trace.calls) + sum(trace.skipped.values()) >= calls or time.monotonic() > deadline:
            return trace
        await asyncio.sleep(0.05)


async def first_generation(backend: str, model: str) -> None:
    """One token from vLLM directly (not through the proxy, so nothing is recorded): its first generation warms up
    the CPU kernels, a few seconds that would otherwise delay the first rollout. A failure is the rollout's to tell."""
    import httpx

    with contextlib.suppress(httpx.HTTPError):
        async with httpx.AsyncClient(timeout=60) as http:
            await http.post(f"{backend}/completions", json={"model": model, "prompt": "hi", "max_tokens": 1})


def token_view_url(proxy_url: str, rollout_id: str) -> str:
    """The web view's page of the rollout's training rows, token by token (docs/view.md)."""
    return f"{proxy_url}/#/rollouts/{rollout_id}/tokens"


async def serve(args: argparse.Namespace, backend: str, model: str, db: Path, tokenizer: str | None) -> None:
    task = asyncio.current_task()
    assert task is not None
    for stop_signal in STOP_SIGNALS:  # cancel the rollouts and the wait: the proxy stops on the way out
        asyncio.get_running_loop().add_signal_handler(stop_signal, task.cancel)
    # While the proxy starts: vLLM's first generation (seconds of warm-up on a CPU) and the tokenizer's load.
    warm_up = asyncio.create_task(first_generation(backend, model))
    decoding = asyncio.create_task(asyncio.to_thread(load_decoder, tokenizer))
    settings = trainer_settings()
    say(f"agl proxy serve: starting (embedded SQLite store {db}, web view)")
    # The view is told the model's tokenizer (`view.tokenizer`): the proxy forwards to vLLM under a served name
    # that is no path, so the view could not find the tokenizer by itself.
    view = ["--page-setting", f"view.tokenizer={tokenizer}"] if tokenizer else []
    async with agl_proxy_serve(backend, model, db, port=args.port, env=CHILD_ENV, extra_args=view) as proxy_url:
        decode = await decoding
        await warm_up
        store = await LightningStoreClient(proxy_url).open()  # the proxy serves its embedded store too
        traces: list[RolloutTrace] = []
        rows = 0
        try:
            for number in range(1, args.rollouts + 1):
                task_text = TASKS[(number - 1) % len(TASKS)]
                say(f"rollout {number}/{args.rollouts}: the OpenAI-SDK agent, 3 turns and a lookup tool: {task_text!r}")
                rollout = await run_rollout(store, proxy_url, model, task_text)
                aggregation = training_rows(rollout.trace, settings)
                traces.append(rollout.trace)
                rows += len(aggregation.rows)
                print(f"  {rollout.rollout_id}, reward {rollout.trace.reward:.2f}", flush=True)
                for line in rollout_lines(rollout.trace, aggregation, decode):
                    print(line, flush=True)
                print(f"  token view: {token_view_url(proxy_url, rollout.rollout_id)}", flush=True)
        finally:
            await store.close()
        say(summary(traces, rows))
        say(f"web view: {proxy_url}/  (rollouts, their calls and the token view of their rows)")
        if not args.no_wait:
            say("serving until Ctrl-C")
            await asyncio.Event().wait()
        say("agl proxy serve: stopping")


if __name__ == "__main__":
    sys.exit(main())
