"""`./scripts/agl demo`: vLLM → `agl proxy serve` (embedded store, web view) → a LangChain agent; then the view
until Ctrl-C.

    ./scripts/agl demo                     # sets up .venv and the tiny model first when needed
    ./scripts/agl demo --rollouts 2 --no-wait
    python -m examples.quickstart.demo     # the same, in a venv that has agl's test requirements

Builds the tiny model (cached in .cache/tiny-qwen2), starts vLLM on it, starts `agl proxy serve` with its embedded
SQLite store, runs the quickstart agent (agent.py) for a few rollouts through the proxy, prints each rollout's spans
as token ids and the web view's URL, and serves until Ctrl-C or SIGTERM; then it stops the proxy and vLLM. Nothing
is downloaded: the model and its tokenizer are built here, LiteLLM uses its bundled cost map.

It is an example, not a command of the installed `agl`: it runs the repository's tiny model and agent.
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
from pathlib import Path

from agl_proxy.server.cli import positive_int
from agl_store.client import LightningStoreClient

from .run import agl_proxy_serve, print_spans, rollout_spans, run_rollout

# What the processes the demo starts need to stay offline (and quiet about it).
OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM fetches its cost map from the internet otherwise
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
QUESTIONS = (
    ("What is (3 + 4) * 12?", "84"),
    ("What is 17 * 23?", "391"),
    ("What is (120 - 38) / 2?", "41"),
    ("What is 1000 - 7 * 7?", "951"),
)


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


@contextlib.contextmanager
def tiny_model_on_vllm() -> Iterator[tuple[str, str, Path]]:
    """(base URL, served name, model directory) of the tiny model on a vLLM this process starts and stops."""
    from examples.tiny_vllm.tiny_model import DEFAULT_DIR, is_built
    from examples.tiny_vllm.vllm_server import build_tiny_model, running_vllm_server

    say(f"tiny model: {'reusing' if is_built(DEFAULT_DIR) else 'building (a minute at most)'} {DEFAULT_DIR}")
    model_path = build_tiny_model(DEFAULT_DIR)
    log = Path(tempfile.gettempdir()) / "agl-demo-vllm.log"
    say(f"vLLM: starting on {model_path} (about a minute on a CPU; log {log})")
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        stack.callback(say, "vLLM: stopped")  # also after a failed start or a Ctrl-C while it starts
        server = stack.enter_context(running_vllm_server(model_path, log_path=log, extra_env=OFFLINE_ENV))
        say(f"vLLM: ready at {server.base_url} ({time.monotonic() - started:.0f} s)")
        stack.callback(say, "vLLM: stopping")
        yield server.base_url, server.model, model_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="./scripts/agl demo",
        description="tiny vLLM, `agl proxy serve` with its store and view, a LangChain agent's rollouts; "
        "serves until Ctrl-C",
    )
    parser.add_argument("--rollouts", type=positive_int, default=3, help="how many agent rollouts to run (default 3)")
    parser.add_argument("--no-wait", action="store_true", help="stop everything and exit once the rollouts are printed")
    parser.add_argument(
        "--backend", metavar="URL", help="a running vLLM's OpenAI base URL instead of starting the tiny model on vLLM"
    )
    parser.add_argument("--model", help="with --backend: the model name it serves (default: the tiny model's)")
    parser.add_argument("--tokenizer", metavar="PATH", help="the view's tokenizer (default: the tiny model's)")
    parser.add_argument("--db", metavar="PATH", help="keep the store in this SQLite file (default: a temporary one)")
    parser.add_argument("--port", type=int, default=0, help="the proxy's port (default 0: a free one)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The demo with `build_parser()`'s arguments; 0 also when stopped by Ctrl-C or SIGTERM."""
    from examples.tiny_vllm.tiny_model import DEFAULT_DIR, SERVED_MODEL_NAME

    # Ctrl-C and SIGTERM stop everything cleanly, also where the shell started the demo with SIGINT ignored.
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.default_int_handler)
    try:
        with contextlib.ExitStack() as stack:
            if args.backend:
                backend, model, model_path = args.backend, args.model or SERVED_MODEL_NAME, DEFAULT_DIR
                say(f"vLLM: using {backend} (--backend), model {model}")
            else:
                backend, model, model_path = stack.enter_context(tiny_model_on_vllm())
            tokenizer = args.tokenizer or (str(model_path) if model == SERVED_MODEL_NAME else None)
            db = Path(args.db) if args.db else Path(stack.enter_context(tempfile.TemporaryDirectory())) / "agl.db"
            asyncio.run(_serve(args, backend, model, db, tokenizer))
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C, SIGTERM: everything above has stopped
        pass
    say("done")
    return 0


async def _serve(args: argparse.Namespace, backend: str, model: str, db: Path, tokenizer: str | None) -> None:
    task = asyncio.current_task()
    assert task is not None
    for stop_signal in STOP_SIGNALS:  # cancel the rollouts and the wait: the proxy stops on the way out
        asyncio.get_running_loop().add_signal_handler(stop_signal, task.cancel)
    view_options = ["--page-setting", f"view.tokenizer={tokenizer}"] if tokenizer else []
    say(f"agl proxy serve: starting (embedded SQLite store {db})")
    serving = agl_proxy_serve(backend, model, db, port=args.port, env=OFFLINE_ENV, extra_args=view_options)
    async with serving as proxy_url:  # prints its own lines
        store = await LightningStoreClient(proxy_url).open()  # the proxy serves its embedded store too
        try:
            for number in range(args.rollouts):
                question, answer = QUESTIONS[number % len(QUESTIONS)]
                say(f"rollout {number + 1}/{args.rollouts}: the LangChain agent answers {question!r}")
                try:
                    rollout_id = await run_rollout(store, proxy_url, model, question, answer, max_answer_chars=60)
                except asyncio.CancelledError:
                    say(f"rollout {number + 1}/{args.rollouts}: agent stopped")
                    raise
                print_spans(rollout_id, await rollout_spans(store, rollout_id), max_response_ids=12)
        finally:
            await store.close()
        print()
        say(f"web view: {proxy_url}/  (the rollouts, their spans and tokens)")
        if not args.no_wait:
            say("serving until Ctrl-C")
            await asyncio.Event().wait()
        say("agl proxy serve: stopping")


if __name__ == "__main__":
    sys.exit(main())
