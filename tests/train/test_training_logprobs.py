"""The trainer's replicas ask for log-probs on every call: the off-policy correction never lacks
them, even behind a proxy started without `--logprobs`."""

from __future__ import annotations

import httpx
import pytest

from agl_proxy.server.proxy import LLMProxy
from agl_store.sqlite import SQLiteStore
from agl_train.core.traces import read_rollout
from agl_train.runner.proxy_control import ProxyControl, publish_replicas

pytestmark = pytest.mark.slow


async def test_a_call_to_the_published_replicas_records_its_sampling_log_probs_and_version(vllm_server, tmp_path):
    async with SQLiteStore(tmp_path / "agl.db") as store:
        proxy = LLMProxy(model_list=[], store=store, port=0)  # no logprobs of its own
        await proxy.start()
        control = ProxyControl(proxy.url)
        try:
            await publish_replicas(store, control, [vllm_server.base_url], version="7")
            rollout = await store.start_rollout(input={"question": "hi"})
            rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
            async with httpx.AsyncClient(timeout=120) as http:
                answer = await http.post(
                    f"{proxy.url}/rollout/{rid}/attempt/{aid}/v1/chat/completions",
                    json={"model": "gpt-5.1-codex", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                )
            assert answer.status_code == 200, answer.text
            assert await control.wait_spans_exported(timeout_s=30)

            (call,) = (await read_rollout(store, rid)).calls
        finally:
            await control.aclose()
            await proxy.stop()

    assert call.logprobs is not None and len(call.logprobs) == len(call.response_ids) > 0
    assert call.model_version == 7
