"""Proxies in front of a served store: several proxy processes, and a store that dies and returns."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from agl_proxy.server.proxy import LLMProxy
from agl_store.client import LightningStoreClient

from .conftest import chat_body
from .helpers import model_entry, wait_for_spans
from .test_cli import AGL, _start, _stop


async def _store_server(db: Path, port: int = 0) -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(
        AGL,
        "store",
        "serve",
        "--db",
        str(db),
        "--port",
        str(port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    if b"listening on " not in line:
        process.kill()
        pytest.fail(f"agl store serve did not start: {line + await process.stdout.read()!r}")
    return process, line.split(b"listening on ")[1].split()[0].decode()


async def test_two_proxy_processes_number_one_rollout_in_call_order(backend, tmp_path: Path, http) -> None:
    store_process, store_url = await _store_server(tmp_path / "shared.db")
    proxies: list[asyncio.subprocess.Process] = []
    try:
        urls = []
        for _ in range(2):
            process, url = await _start("--backend", backend[1], "--model", "tiny", "--store-url", store_url)
            proxies.append(process)
            urls.append(url)
        store = await LightningStoreClient(store_url).open()
        rollout = await store.start_rollout(input={"q": 1})
        path = f"/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1/chat/completions"
        for i in range(8):
            response = await http.post(urls[i % 2] + path, json=chat_body())
            assert response.status_code == 200
        spans = await wait_for_spans(store, rollout.rollout_id, 8)
        by_start = sorted(spans, key=lambda s: s.start_time)
        assert [s.sequence_id for s in by_start] == list(range(1, 9))
        await store.close()
        # Each proxy serves the store server's routes too (the trainer's one URL for both).
        through_proxy = await LightningStoreClient(urls[1]).open()
        assert len(await through_proxy.query_spans(rollout.rollout_id)) == 8
        await through_proxy.close()
    finally:
        for process in proxies:
            await _stop(process)
        store_process.send_signal(signal.SIGTERM)
        await store_process.wait()


async def test_store_killed_and_restarted_mid_run(backend, tmp_path: Path, http) -> None:
    db = tmp_path / "store.db"
    store_process, store_url = await _store_server(db)
    port = int(store_url.rsplit(":", 1)[1])
    client = await LightningStoreClient(store_url, retries=1).open()
    proxy = LLMProxy([model_entry("tiny", backend[1])], client, port=0)
    await proxy.start()
    try:
        rollout = await client.start_rollout(input={"q": 1})
        base = proxy.as_resource().get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)
        assert (await http.post(base + "/chat/completions", json=chat_body())).status_code == 200
        await wait_for_spans(client, rollout.rollout_id, 1)

        store_process.kill()  # no goodbye: SIGKILL
        await store_process.wait()
        for _ in range(3):
            assert (await http.post(base + "/chat/completions", json=chat_body())).status_code == 200
        while proxy.state.exporter.failed_attempts == 0:
            await asyncio.sleep(0.05)

        store_process, _ = await _store_server(db, port)
        spans = await wait_for_spans(client, rollout.rollout_id, 4, timeout_s=30)
        assert len(spans) == 4 and len({s.sequence_id for s in spans}) == 4
        assert proxy.state.exporter.rejected == 0
    finally:
        await proxy.stop()
        await client.close()
        store_process.send_signal(signal.SIGTERM)
        await store_process.wait()
