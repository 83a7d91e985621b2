"""How many consecutive calls of an agent keep the token prefix, through `agl proxy serve`, on a real vocabulary.

A 3-call tool agent (the unmodified OpenAI SDK, temperature 1, tools offered) runs `--rollouts` times through
`agl proxy serve` (embedded SQLite store) in front of vLLM on the real-vocabulary tiny model
(`examples/tiny_vllm/real_vocab.py`). Its calls are read back as the trainer reads them (`read_rollout`), and
for every pair of consecutive calls the benchmark checks what trajectory rows need: the later prompt starts
with exactly the earlier prompt + its generated ids. It prints kept pairs / all pairs, the rows per rollout, the
breaks by cause (`agl_train.core.prefix_break`), and the calls by how the proxy made their prompt (`agl.chain`;
`unchained` before it recorded that) and the tokens per rollout of its training rows (prompt + response: what a
step processes; and response: what it trains). The random model answers noise, so the agent always goes on for 3
calls: after a tool call it returns a tool result, after text it asks again.

`--flavour qwen3` serves the Qwen3 flavour with vLLM's qwen3 reasoning parser: the random model never closes its
think block, so every answer is reasoning, sent back by the SDK, and every follow-up is a new user turn, where
Qwen3's template drops the earlier reasoning: with `template` those calls branch, their prompts the template's
rendering rebuilt from the model's own ids (here there is no content to keep: every answer is reasoning), and with
`keep` they are bridged. `--reasoning template keep` runs the agent once per deployment setting
(`model_info.agl_reasoning`, docs/proxy.md "Token chain"), each through its own proxy and store, against the same
vLLM.

    .venv/bin/python benchmarks/token_chain_bench.py                        # starts vLLM (about 2 min)
    .venv/bin/python benchmarks/token_chain_bench.py --vllm http://127.0.0.1:PORT/v1   # a vLLM on the model
    .venv/bin/python benchmarks/token_chain_bench.py --flavour qwen3 --reasoning template keep
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agl_store import call_span  # noqa: E402
from agl_train.core.aggregate import Limits, aggregate  # noqa: E402
from agl_train.core.traces import read_rollout  # noqa: E402
from examples.tiny_vllm.vllm_server import free_port, running_vllm_server  # noqa: E402
from tests.support.conversations import tools  # noqa: E402

CALLS_PER_ROLLOUT = 3


def run_agent(base_url: str, model: str, max_tokens: int) -> None:
    """The agent: three calls, each sending the history back as the SDK returned it."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages: list[Any] = [
        {"role": "system", "content": "You answer weather questions with the get_weather tool."},
        {"role": "user", "content": "What is the weather in Paris today?"},
    ]
    for _ in range(CALLS_PER_ROLLOUT):
        answer = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=tools(),
            temperature=1.0,
            max_tokens=max_tokens,  # type: ignore[arg-type]
        )
        message = answer.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if message.tool_calls:
            for tool_call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": '{"sky": "clear"}'})
        else:
            messages.append({"role": "user", "content": "Please call the tool."})


@contextmanager
def proxy_serve(backend: str, model: str, workdir: Path, reasoning: str) -> Iterator[str]:
    """`agl proxy serve` on a free port with an embedded store in `workdir`, its deployment's reasoning
    `model_info.agl_reasoning`; yields its root URL."""
    port = free_port()
    entry = {
        "model_name": model,
        "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": backend},
        "model_info": {"agl_reasoning": reasoning},
    }
    config = workdir / "proxy.yaml"
    config.write_text(json.dumps({"model_list": [entry]}))  # JSON is YAML
    command = [
        sys.executable, "-m", "agl_store.cli", "proxy", "serve", "--config", str(config),
        "--db", str(workdir / "agl.db"), "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    log = open(workdir / "proxy.log", "wb")  # closed in the finally below
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        for _ in range(120):
            if process.poll() is not None:
                raise RuntimeError(f"agl proxy serve exited: {(workdir / 'proxy.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


async def measure(url: str, model: str, rollouts: int, max_tokens: int, tokenizer: Any) -> dict[str, Any]:
    from agl_store.client import LightningStoreClient

    store = LightningStoreClient(url)
    started = []
    for _ in range(rollouts):
        rollout = await store.start_rollout(input={"question": "weather"})
        rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
        await asyncio.to_thread(run_agent, f"{url}/rollout/{rid}/attempt/{aid}/v1", model, max_tokens)
        started.append(rid)
    traces = []
    for rid in started:
        for _ in range(200):  # the proxy exports spans in the background
            if len(await store.query_spans(rid, "latest", name=call_span.NAME)) >= CALLS_PER_ROLLOUT:
                break
            await asyncio.sleep(0.05)
        traces.append(await read_rollout(store, rid))
    await store.close()
    wide = Limits(max_prompt_length=1 << 20, max_response_length=1 << 20)
    result = aggregate(traces, "trajectory", wide, tokenizer)
    pairs = sum(max(len(trace.calls) - 1, 0) for trace in traces)
    by_prefix = "training/n_llm_calls/"
    n = max(len(traces), 1)
    return {
        "pairs": pairs,
        "kept": pairs - len(result.breaks),
        "rows_per_rollout": {
            "mean": result.metrics["training/rows_per_rollout/mean"],
            "max": result.metrics["training/rows_per_rollout/max"],
        },
        "tokens_per_rollout": {
            "rows": sum(len(r.prompt_ids) + len(r.response_ids) for r in result.rows) / n,
            "trained": sum(sum(r.response_mask) for r in result.rows) / n,
        },
        "breaks": dict(Counter(b.kind for b in result.breaks)),
        "calls_by_chain": {k.removeprefix(by_prefix): v for k, v in result.metrics.items() if k.startswith(by_prefix)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--vllm", help="base URL of a vLLM already serving the model (else one is started)")
    parser.add_argument("--flavour", default="qwen2.5", choices=["qwen2.5", "qwen3"])
    parser.add_argument("--reasoning", nargs="+", default=["template"], choices=["template", "keep"])
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from examples.tiny_vllm.real_vocab import FLAVOURS, build

    flavour = FLAVOURS[args.flavour]
    model_path = build(flavour=flavour)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    parser_args = ("--reasoning-parser", "qwen3") if flavour is FLAVOURS["qwen3"] else ()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        backend = args.vllm
        if backend is None:
            server = stack.enter_context(
                running_vllm_server(
                    model_path,
                    log_path=workdir / "vllm.log",
                    served_model_name=flavour.served_model_name,
                    extra_args=("--enable-scale-out", *parser_args),
                )
            )
            backend = server.base_url
        for reasoning in args.reasoning:
            run_dir = workdir / reasoning
            run_dir.mkdir()
            with proxy_serve(backend, flavour.served_model_name, run_dir, reasoning) as url:
                model = flavour.served_model_name
                figures = asyncio.run(measure(url, model, args.rollouts, args.max_tokens, tokenizer))
            print(
                f"consecutive calls that keep the prefix: {figures['kept']} of {figures['pairs']} "
                f"({args.rollouts} rollouts x {CALLS_PER_ROLLOUT} calls, {model}, agl_reasoning {reasoning}, "
                f"temperature 1, max_tokens {args.max_tokens})"
            )
            print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
