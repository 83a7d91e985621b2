"""A custom algorithm in Python: the store, the proxy and the rollouts driven by your own code.

    .venv/bin/python -m examples.custom_algorithm.run                  # starts the tiny test vLLM itself
    .venv/bin/python -m examples.custom_algorithm.run --backend http://127.0.0.1:8000/v1 --model NAME

It opens a store, starts an `LLMProxy` in this process, points it at vLLM
(`update_model_list`), publishes the proxy as the rollouts' LLM (`add_resources`), enqueues
rollouts (two for training, one for validation), runs a tiny agent for each of them as a
rollout runner would, waits for them, and reads their spans: the token ids the model saw
and produced, whether they were all there, and the sampling the proxy enforced by mode.
This is where an algorithm of your own would turn the token ids and rewards into an update.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path

import openai

from agl_proxy import LLMProxy
from agl_store import LightningStore, ProxyLLM, call_span, open_store, reward_span
from agl_store.models import REWARD_VALUE_ATTRIBUTE
from agl_store.opening import db_url

TASKS = [("train", "rivers"), ("train", "mountains"), ("val", "forests")]
SAMPLING = {"train": {"temperature": 1.0, "max_tokens": 16}, "val": {"temperature": 0.0, "max_tokens": 16}}


async def tiny_agent(llm: ProxyLLM, rollout_id: str, attempt_id: str, topic: str) -> str:
    """An unmodified agent: it only knows an OpenAI base URL (the rollout's) and a model name."""
    client = openai.AsyncOpenAI(base_url=llm.get_base_url(rollout_id, attempt_id), api_key=llm.api_key or "none")
    try:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": f"Write one sentence about {topic}."}]
        )
    finally:
        await client.close()
    return reply.choices[0].message.content or ""


def reward_of(answer: str) -> float:
    """The share of the answer's characters that are lowercase letters or spaces."""
    return sum(c.islower() or c == " " for c in answer) / max(len(answer), 1)


async def run_queued_rollouts(store: LightningStore) -> None:
    """What a rollout runner does: take each queued rollout, run the agent with its LLM, report a reward."""
    while (rollout := await store.dequeue_rollout(worker_id="example-runner")) is not None:
        assert rollout.resources_id is not None
        resources = await store.get_resources_by_id(rollout.resources_id)
        assert resources is not None
        llm = resources.resources["main_llm"]
        assert isinstance(llm, ProxyLLM)
        attempt_id = rollout.attempt.attempt_id
        answer = await tiny_agent(llm, rollout.rollout_id, attempt_id, rollout.input["topic"])
        await store.add_span(reward_span(rollout.rollout_id, attempt_id, reward_of(answer)))
        await store.update_attempt(rollout.rollout_id, attempt_id, status="succeeded")


async def algorithm(store: LightningStore, backend: str, model: str) -> None:
    proxy = LLMProxy(store=store, port=0, require_token_ids=True, sampling_by_mode=SAMPLING)
    await proxy.start()
    try:
        proxy.update_model_list(
            [{"model_name": model, "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": backend}}]
        )
        resources = await store.add_resources({"main_llm": proxy.as_resource()})
        rollouts = [
            await store.enqueue_rollout(input={"topic": topic}, mode=mode, resources_id=resources.resources_id)
            for mode, topic in TASKS
        ]
        ids = [r.rollout_id for r in rollouts]
        await run_queued_rollouts(store)  # elsewhere in a real run: runner processes sharing the store
        finished = await store.wait_for_rollouts(rollout_ids=ids, timeout=60)
        print(f"{len(finished)}/{len(ids)} rollouts finished")
    finally:
        await proxy.stop()  # writes the span of every answered call not written yet
    await report(store, ids)


async def report(store: LightningStore, rollout_ids: list[str]) -> None:
    """Each rollout's calls as the algorithm reads them: token ids, their status, the sampling applied."""
    for rollout_id in rollout_ids:
        rollout = await store.get_rollout_by_id(rollout_id)
        assert rollout is not None
        print(f"\nrollout {rollout_id} ({rollout.mode}, {rollout.status}):")
        for span in await store.query_spans(rollout_id):
            attrs = span.attributes
            if span.name != call_span.NAME:
                print(f"  #{span.sequence_id} reward = {attrs[REWARD_VALUE_ATTRIBUTE]:.2f}")
                continue
            prompt = attrs[call_span.PROMPT_TOKEN_IDS] or []
            response = attrs[call_span.CHOICES][0]["token_ids"] or []
            print(f"  #{span.sequence_id} {span.name}: token ids {attrs[call_span.TOKEN_IDS_STATUS]}, "
                  f"sampling {attrs[call_span.SAMPLING]} (mode {attrs.get(call_span.SAMPLING_MODE)})")  # fmt: skip
            print(f"      prompt_token_ids   ({len(prompt)}): {prompt[:12]} ...")
            print(f"      response token_ids ({len(response)}): {response}")


async def main_async(args: argparse.Namespace) -> None:
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agl-custom-algorithm-")))
        backend, model = args.backend, args.model
        if not backend:
            from examples.tiny_vllm.vllm_server import build_tiny_model, running_vllm_server

            print(f"starting the tiny vLLM (about a minute on a CPU; log: {workdir / 'vllm.log'}) ...", flush=True)
            server = stack.enter_context(running_vllm_server(build_tiny_model(), log_path=workdir / "vllm.log"))
            backend, model = server.base_url, server.model
        db = args.db or str(workdir / "agl.db")
        store = await open_store(db_url(db))
        try:
            await algorithm(store, backend, model)
        finally:
            await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", help="a running vLLM's OpenAI base URL (default: start the tiny test model)")
    parser.add_argument("--model", help="the model name vLLM serves (with --backend)")
    parser.add_argument("--db", help="the store: a SQLite path or store URL (default: a temporary SQLite file)")
    args = parser.parse_args(argv)
    if args.backend and not args.model:
        parser.error("--backend needs --model")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
