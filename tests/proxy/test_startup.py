"""A proxy with only OpenAI-compatible backends never imports LiteLLM (seconds of CPU saved)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import asyncio, sys, httpx
from agl_proxy import LLMProxy

async def main(url):
    entry = {"model_name": "tiny", "litellm_params": {"model": "hosted_vllm/tiny", "api_base": url}}
    proxy = LLMProxy(model_list=[entry], port=0)
    await proxy.start()
    async with httpx.AsyncClient() as http:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        assert (await http.post(proxy.base_url + "/chat/completions", json=body)).status_code == 200
    await proxy.stop()
    print("litellm imported:", "litellm" in sys.modules)

asyncio.run(main(sys.argv[1]))
"""


async def test_vllm_only_proxy_does_not_import_litellm(backend) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SCRIPT,
        backend[1],
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, out.decode()
    assert b"litellm imported: False" in out
