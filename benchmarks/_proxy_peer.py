"""agent-lightning 0.3's LLMProxy with its in-memory store, run inside the peer venv.

    PEER_PYTHON benchmarks/_proxy_peer.py PORT BACKEND_BASE_URL MODEL

Prints one JSON line `{"rollout_id", "attempt_id"}` (a rollout to attribute calls to)
once the proxy serves, then serves until killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


async def main(port: int, backend: str, model: str) -> None:
    from agentlightning.llm_proxy import LLMProxy
    from agentlightning.store.memory import InMemoryLightningStore

    store = InMemoryLightningStore()
    model_list = [{"model_name": model, "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": backend}}]
    proxy = LLMProxy(port=port, model_list=model_list, store=store, host="127.0.0.1", launch_mode="asyncio")
    await proxy.start()
    rollout = await store.start_rollout(input={"bench": True})
    print(json.dumps({"rollout_id": rollout.rollout_id, "attempt_id": rollout.attempt.attempt_id}), flush=True)
    while True:
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
