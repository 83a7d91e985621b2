"""Bytes a multi-turn rollout takes in the store, LLM calls stored whole vs as deltas.

    .venv/bin/python benchmarks/span_storage_bench.py                    # 8, 16, 32, 64 turns
    .venv/bin/python benchmarks/span_storage_bench.py --turns 8,16 --rollouts 2 --json artifacts/storage.json

Each rollout is an agent run through `agl proxy serve` (its embedded SQLite store) against a
vLLM-shaped fake backend (this file, `--serve-backend PORT`) that tokenizes with a chat
template, so each call's prompt ids start with the previous call's prompt + response ids, as a
real model's do. The agent starts with a 4,000-character system prompt; each turn gets a
100-token answer and adds an 800-character tool result. One store per (turns, mode):
`?deltas=off` (every span whole) and the default (deltas). Per rollout it reports the database
bytes the spans added (file + WAL, checkpointed, before and after the agents ran), and bytes
per token id the trainer needs (the last prompt plus every response), and checks that both
stores return the same spans.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import time
import zlib
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(1, str(BENCH_DIR.parent))

SYSTEM_CHARS = 4000
TOOL_CHARS = 800
ANSWER_TOKENS = 100
VOCAB = 50_000
ROLES = {"system": 1, "user": 2, "assistant": 3, "tool": 4}
END = 5


def words(text: str) -> list[int]:
    """The fake tokenizer: a word per token; `w123` is token 123, other words hash."""
    ids = []
    for word in text.split():
        if word.startswith("w") and word[1:].isdigit():
            ids.append(int(word[1:]))
        else:
            ids.append(10 + zlib.crc32(word.encode()) % VOCAB)
    return ids


def template(messages: list[dict[str, Any]]) -> list[int]:
    ids: list[int] = []
    for message in messages:
        ids += [ROLES.get(message.get("role", "user"), 2), *words(str(message.get("content") or "")), END]
    return [*ids, ROLES["assistant"]]


def completion(request: dict[str, Any], call: int) -> dict[str, Any]:
    prompt = template(request.get("messages", []))
    seed = zlib.crc32(str(prompt).encode())  # the same prompt gets the same answer in every run
    answer = [10 + (seed * 7919 + i * 104729) % VOCAB for i in range(ANSWER_TOKENS - 1)]
    text = " ".join(f"w{t}" for t in answer)
    token_ids = [*answer, END]
    logprobs = None
    if request.get("logprobs"):
        logprobs = {
            "content": [{"token": f"w{t}", "logprob": -0.25, "bytes": None, "top_logprobs": []} for t in token_ids]
        }
    return {
        "id": f"chatcmpl-{call}", "object": "chat.completion", "created": 0, "model": request.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                     "logprobs": logprobs, "finish_reason": "stop", "stop_reason": None, "token_ids": token_ids}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(token_ids),
                  "total_tokens": len(prompt) + len(token_ids)},
        "prompt_token_ids": prompt, "prompt_logprobs": None, "kv_transfer_params": None,
    }  # fmt: skip


def serve_backend(port: int) -> None:
    import uvicorn
    from _proxy_fake_backend import request_body

    calls = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal calls
        body = await request_body(scope, receive, send)
        if body is None:
            return
        calls += 1
        payload = json.dumps(completion(json.loads(body or b"{}"), calls)).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def agent(base_url: str, turns: int, seed: int) -> None:
    import httpx

    system = " ".join(f"rule{seed}x{i}" for i in range(SYSTEM_CHARS // 10))[:SYSTEM_CHARS]
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": "solve it"}]
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        for turn in range(turns):
            answer = await client.post("/chat/completions", json={"model": "bench", "messages": messages})
            answer.raise_for_status()
            content = answer.json()["choices"][0]["message"]["content"]
            tool = " ".join(f"out{turn}y{i}" for i in range(TOOL_CHARS // 8))[:TOOL_CHARS]
            messages += [{"role": "assistant", "content": content}, {"role": "tool", "content": tool}]


def db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


async def rollout_spans(db: Path) -> list[list[Any]]:
    """Each rollout's spans, read back through the store (whole spans)."""
    from agl_store.sqlite import SQLiteStore

    async with SQLiteStore(db) as store:
        rollouts = await store.query_rollouts(sort_by="start_time")
        return [list(await store.query_spans(r.rollout_id, "latest")) for r in rollouts]


def needed_ids(spans: list[Any]) -> int:
    calls = [s for s in spans if s.name == "agl.llm_call"]
    return len(calls[-1].attributes["agl.prompt_token_ids"]) + sum(
        len(c["token_ids"]) for s in calls for c in s.attributes["agl.choices"]
    )


def run_setting(backend_url: str, workdir: Path, turns: int, rollouts: int, deltas: bool) -> dict[str, Any]:
    import proxy_bench as pb

    db = workdir / f"turns{turns}-{'deltas' if deltas else 'whole'}.db"
    url = f"sqlite:///{db}" + ("" if deltas else "?deltas=off")
    with pb.agl_proxy(backend_url, "bench", url, workdir / f"proxy-{turns}-{deltas}.log") as (proxy_url, _, _):  # type: ignore[arg-type]
        ids = asyncio.run(pb._agl_rollouts(proxy_url, rollouts))
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        empty = db_bytes(db)  # the schema and the rollouts: not what the spans cost

        async def all_agents() -> None:
            await asyncio.gather(
                *(agent(pb.rollout_base_url(proxy_url, r, a), turns, seed) for seed, (r, a) in enumerate(ids))
            )

        started = time.perf_counter()
        asyncio.run(all_agents())
        elapsed = time.perf_counter() - started
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        calls, deltas_n = conn.execute("SELECT count(*), count(base_pk) FROM spans").fetchone()
    spans = asyncio.run(rollout_spans(db))
    needed = sum(needed_ids(s) for s in spans) / len(spans)
    size = (db_bytes(db) - empty) / rollouts
    return {
        "turns": turns, "deltas": deltas, "bytes_per_rollout": size, "needed_ids": needed,
        "bytes_per_needed_id": size / needed, "spans": calls, "stored_as_deltas": deltas_n,
        "seconds": elapsed, "spans_read": spans,
    }  # fmt: skip


def comparable(spans: list[list[Any]]) -> list[list[Any]]:
    keep = {"name", "attributes", "status"}
    return [[s.model_dump(include=keep) for s in rollout] for rollout in spans]


def without_run_fields(rollouts: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Span attributes that differ between two runs of the same agent (ids, times) removed."""
    out = []
    for rollout in rollouts:
        spans = []
        for span in rollout:
            attributes = {
                k: v
                for k, v in span["attributes"].items()
                if k not in ("agl.latency_s", "agl.ttft_s", "agl.response", "agl.backend")
            }
            spans.append({**span, "attributes": attributes})
        out.append(spans)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", default="8,16,32,64")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per setting, run at once")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workdir", type=Path, help="keep the databases and logs here (default: a temporary folder)")
    parser.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_backend:
        serve_backend(args.serve_backend)
        return 0
    import tempfile

    import proxy_bench as pb

    port = pb.free_port()
    results = []
    with tempfile.TemporaryDirectory(prefix="agl-span-storage-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, __file__, "--serve-backend", str(port)]
        with pb.process(cmd, workdir / "backend.log") as backend:
            pb.wait_ready(f"http://127.0.0.1:{port}/v1/models", backend, workdir / "backend.log")
            for turns in (int(t) for t in args.turns.split(",")):
                pair = [
                    run_setting(f"http://127.0.0.1:{port}/v1", workdir, turns, args.rollouts, d) for d in (False, True)
                ]
                reads = [without_run_fields(comparable(r.pop("spans_read"))) for r in pair]
                same = reads[0] == reads[1]
                if not same and os.environ.get("AGL_BENCH_DEBUG"):
                    import pdb

                    pdb.set_trace()
                for result in pair:
                    result["same_spans_read"] = same
                results += pair
    columns = [("turns", 5), ("store", 7), ("KB/rollout", 11), ("ids needed", 10), ("B/needed id", 11)]
    print(" ".join(f"{name:>{width}}" for name, width in [*columns, ("deltas", 7), ("same read", 9)]))
    by_turns: dict[int, dict[bool, dict[str, Any]]] = {}
    for r in results:
        by_turns.setdefault(r["turns"], {})[r["deltas"]] = r
        print(
            f"{r['turns']:>5} {'deltas' if r['deltas'] else 'whole':>7} {r['bytes_per_rollout'] / 1000:>11.1f} "
            f"{r['needed_ids']:>10.0f} {r['bytes_per_needed_id']:>11.1f} {r['stored_as_deltas']:>3}/{r['spans']:<3} "
            f"{str(r['same_spans_read']):>9}"
        )
    for turns, pair in by_turns.items():
        print(
            f"{turns} turns: whole / deltas = {pair[False]['bytes_per_rollout'] / pair[True]['bytes_per_rollout']:.1f}x"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    raise SystemExit(main())
