"""The quickstart, end to end: vLLM → `agl proxy serve` → a LangChain agent → spans with token ids.

    .venv/bin/python -m examples.quickstart.run                  # starts the tiny test vLLM itself
    .venv/bin/python -m examples.quickstart.run --backend http://127.0.0.1:8000/v1 --model NAME
    .venv/bin/python -m examples.quickstart.run --proxy http://127.0.0.1:8080 --model NAME

It starts `agl proxy serve` (embedded SQLite store, one port) unless `--proxy` names a
running one, creates a rollout, runs the agent on the rollout's base URL, records a
reward, and prints the rollout's spans: what the model saw and produced, as token ids.
`./scripts/agl demo` (examples/demo/run.py) runs a multi-turn tool agent the same way and keeps serving.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path

from agl_store import LightningStore, ProxyLLM, Span, call_span, reward_span
from agl_store.client import LightningStoreClient
from agl_store.models import REWARD_SPAN_NAME, REWARD_VALUE_ATTRIBUTE

PROXY_START_TIMEOUT_S = 60.0


QUESTION = "What is (3 + 4) * 12?"
ANSWER = "84"


@contextlib.contextmanager
def tiny_vllm() -> Iterator[tuple[str, str]]:
    """The repository's tiny random-weight Qwen2 on vLLM (about a minute to start on a CPU)."""
    from examples.tiny_vllm.vllm_server import build_tiny_model, running_vllm_server

    log = Path(tempfile.gettempdir()) / "agl-quickstart-vllm.log"
    print(f"starting the tiny vLLM (log: {log}) ...", flush=True)
    with running_vllm_server(build_tiny_model(), log_path=log) as server:
        yield server.base_url, server.model


@contextlib.asynccontextmanager
async def agl_proxy_serve(
    backend: str,
    model: str,
    db: Path,
    *,
    port: int = 0,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> AsyncIterator[str]:
    """`agl proxy serve [extra_args]` as a subprocess; yields its URL once it listens, echoing its own lines.
    It imports no agent: `./scripts/agl demo` (examples/demo) uses it in a venv without LangChain."""
    # This interpreter's own `agl` first: another one on PATH may be another install of agl.
    beside = Path(sys.executable).parent / "agl"
    agl = str(beside) if beside.exists() else shutil.which("agl") or "agl"
    process = await asyncio.create_subprocess_exec(
        agl, "proxy", "serve", "--backend", backend, "--model", model, "--db", str(db), "--port", str(port),
        *extra_args, stdout=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert process.stdout is not None
    echo: asyncio.Task[None] | None = None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), PROXY_START_TIMEOUT_S)).decode()
        print(line.strip(), flush=True)
        match = re.search(r"listening on (http://\S+)", line)
        if match is None:
            raise RuntimeError("agl proxy serve did not start")
        echo = asyncio.create_task(_echo(process.stdout))
        yield match.group(1)
    finally:
        if process.returncode is None:
            process.terminate()  # it prints its stop line and exits
        await process.wait()
        if echo is not None:
            await echo


async def _echo(stream: asyncio.StreamReader) -> None:
    async for line in stream:
        print(line.decode().rstrip(), flush=True)


async def run_rollout(
    store: LightningStore, proxy_url: str, model: str, question: str, expected: str, *, max_answer_chars: int = 0
) -> str:
    """One rollout: the agent answers `question` through the proxy; reward 1 if the reply has the number `expected`.

    Prints the agent's base URL and its answer (its first `max_answer_chars`; 0: all); returns the rollout id.
    """
    from .agent import run_agent  # LangChain: imported only where the agent runs

    rollout = await store.start_rollout(input={"question": question})
    attempt_id = rollout.attempt.attempt_id
    llm = ProxyLLM(endpoint=proxy_url + "/v1", model=model)
    base_url = llm.get_base_url(rollout.rollout_id, attempt_id)
    print(f"\nagent base URL: {base_url}")
    answer = await run_agent(base_url, model, question)
    shown = f"{answer[:max_answer_chars]!r} ..." if 0 < max_answer_chars < len(answer) else repr(answer)
    print(f"agent answer: {shown}")
    reward = 1.0 if re.search(rf"(?<![\d.]){expected}(?![\d.])", answer) else 0.0
    await store.add_span(reward_span(rollout.rollout_id, attempt_id, reward))
    await store.update_attempt(rollout.rollout_id, attempt_id, status="succeeded")
    return rollout.rollout_id


async def rollout_spans(store: LightningStore, rollout_id: str) -> list[Span]:
    """The rollout's spans once the proxy's background export has written its call spans."""
    spans: list[Span] = []
    for _ in range(100):
        spans = await store.query_spans(rollout_id)
        if any(s.name == call_span.NAME for s in spans):
            break
        await asyncio.sleep(0.05)
    return spans


def print_spans(rollout_id: str, spans: list[Span], *, max_prompt_ids: int = 12, max_response_ids: int = 0) -> None:
    """What the model saw and produced in each call, as token ids (the first `max_*_ids` of each list; 0: all)."""
    print(f"\nspans of rollout {rollout_id}:")
    for span in spans:
        attrs = span.attributes
        if span.name == REWARD_SPAN_NAME:
            print(f"  #{span.sequence_id} reward = {attrs[REWARD_VALUE_ATTRIBUTE]}")
            continue
        prompt = attrs[call_span.PROMPT_TOKEN_IDS] or []
        print(f"  #{span.sequence_id} {span.name} {attrs[call_span.REQUEST_MODEL]} via {attrs[call_span.BACKEND]}"
              f" ({attrs[call_span.LATENCY_S] * 1000:.0f} ms)")  # fmt: skip
        print(f"      prompt_token_ids   ({len(prompt)}): {_short(prompt, max_prompt_ids)}")
        for choice in attrs[call_span.CHOICES]:
            ids = choice["token_ids"] or []
            shown = _short(ids, max_response_ids)
            print(f"      response token_ids ({len(ids)}): {shown}  finish={choice['finish_reason']}")


def _short(ids: list[int], count: int) -> str:
    return f"{ids[:count]} ..." if 0 < count < len(ids) else str(ids)


async def show(proxy_url: str, model: str) -> None:
    store = await LightningStoreClient(proxy_url).open()  # the proxy serves its embedded store too
    try:
        rollout_id = await run_rollout(store, proxy_url, model, QUESTION, ANSWER)
        print_spans(rollout_id, await rollout_spans(store, rollout_id))
    finally:
        await store.close()


async def main_async(args: argparse.Namespace) -> None:
    if args.proxy:
        await show(args.proxy.rstrip("/"), args.model)
        return
    with contextlib.ExitStack() as stack:
        backend, model = (args.backend, args.model) if args.backend else stack.enter_context(tiny_vllm())
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agl-quickstart-")))
        async with agl_proxy_serve(backend, model, workdir / "agl.db") as proxy_url:
            await show(proxy_url, model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", help="a running vLLM's OpenAI base URL (default: start the tiny test model)")
    parser.add_argument("--proxy", help="a running `agl proxy serve` (with its embedded store) to use instead")
    parser.add_argument("--model", default=None, help="the model name vLLM serves")
    args = parser.parse_args(argv)
    if (args.backend or args.proxy) and not args.model:
        parser.error("--backend and --proxy need --model")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
