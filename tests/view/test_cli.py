"""`agl view --store URL` and `agl store serve` serve the view as real processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agl_store.cli import build_parser
from agl_store.sqlite import SQLiteStore
from agl_train.view.cli import settings_from_args
from tests.store.http_server import REPO_ROOT, StoreServerProcess

from .rollouts import write_rollout

CALLS = [{"prompt": [1, 2, 3], "response": [4, 5]}]


@contextlib.asynccontextmanager
async def running_agl(*args: str) -> AsyncIterator[str]:
    """Run `agl ARGS --port 0` and yield its URL once it listens; SIGTERM it after (it must stop cleanly)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agl_store.cli", *args, "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    assert process.stdout is not None
    output: list[str] = []
    try:
        while True:
            line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
            output.append(line)
            if not line:
                raise AssertionError(f"agl {args[0]} exited:\n" + "".join(output))
            if "listening on " in line:
                break
        yield line.split("listening on ", 1)[1].split()[0]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        assert ": stopped" in (await process.stdout.read()).decode()


def test_agl_view_is_a_command_with_the_trainers_settings() -> None:
    args = build_parser().parse_args(
        [
            "view",
            "--store",
            "http://127.0.0.1:4747",
            "--tokenizer",
            "/m",
            "--level",
            "transition",
            "--max-response-length",
            "64",
        ]
    )
    settings = settings_from_args(args)

    assert (settings.tokenizer, settings.options.level, settings.options.limits.max_response_length) == (
        "/m",
        "transition",
        64,
    )
    assert settings.options.limits.max_prompt_length == 2048


async def test_agl_view_serves_a_store_server_behind_its_key(tmp_path: Path) -> None:
    server = StoreServerProcess(tmp_path / "agl.db", key="s3cret")
    store_url = await server.start()
    try:
        async with SQLiteStore(str(tmp_path / "agl.db")) as store:
            done = await write_rollout(store, CALLS)
        async with running_agl("view", "--store", store_url, "--key", "s3cret") as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                assert "/view/app.js" in (await http.get("/")).text
                assert (await http.get("/view/api/rollouts")).status_code == 401
                page = await http.get("/view/api/rollouts", headers={"Authorization": "Bearer s3cret"})
                assert [item["rollout_id"] for item in page.json()["items"]] == [done.rollout_id]
                tokens = await http.get(
                    f"/view/api/rollouts/{done.rollout_id}/tokens", headers={"Authorization": "Bearer s3cret"}
                )
                assert tokens.json()["rows"][0]["roles"] == "pppgg"
    finally:
        await server.stop()


async def test_agl_store_serve_serves_the_view_at_the_root(tmp_path: Path) -> None:
    server = StoreServerProcess(tmp_path / "agl.db")
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            page = await http.get("/")
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert (await http.get("/view/api/rollouts")).json()["total"] == 0
    finally:
        await server.stop()


async def test_agl_proxy_serve_serves_the_view_of_its_embedded_store(tmp_path: Path) -> None:
    # No backend is called: the view only reads the store.
    proxy = (
        "proxy",
        "serve",
        "--backend",
        "http://127.0.0.1:9/v1",
        "--model",
        "tiny",
        "--db",
        str(tmp_path / "agl.db"),
    )
    async with running_agl(*proxy) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert "/view/app.js" in (await http.get("/")).text
        assert (await http.get("/view/api/rollouts")).json()["total"] == 0


@pytest.mark.parametrize("bad", [["--level", "episode"], ["--max-prompt-length", "0"]])
def test_agl_view_refuses_bad_settings(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from agl_store.cli import main

    try:
        code = main(["view", "--store", "memory://", *bad])
    except SystemExit as exit:  # argparse's choices
        code = exit.code
    assert code == 2


async def test_agl_proxy_serve_with_a_key_serves_the_page_shell_but_not_the_data(tmp_path: Path) -> None:
    proxy = ("proxy", "serve", "--backend", "http://127.0.0.1:9/v1", "--model", "tiny", "--key", "k1")
    async with (
        running_agl(*proxy, "--db", str(tmp_path / "agl.db")) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        assert "/view/app.js" in (await http.get("/")).text
        assert (await http.get("/view/api/rollouts")).status_code == 401
        authorized = await http.get("/view/api/rollouts", headers={"Authorization": "Bearer k1"})
        assert authorized.json()["total"] == 0


def test_store_serve_hands_page_settings_to_the_view_and_names_a_bad_one(tmp_path, capsys) -> None:
    from agl_store.cli import main
    from agl_store.server import parse_page_settings

    assert parse_page_settings(["view.tokenizer=/models/q", "view.level=transition"]) == {
        "view": {"tokenizer": "/models/q", "level": "transition"}
    }
    db = str(tmp_path / "agl.db")
    assert main(["store", "serve", "--db", db, "--port", "0", "--page-setting", "tokenizer=/models/q"]) == 2
    assert "--page-setting 'tokenizer=/models/q': expected NAME.KEY=VALUE" in capsys.readouterr().err
    assert main(["store", "serve", "--db", db, "--port", "0", "--page-setting", "view.max_prompt_length=x"]) == 2
    assert "view.max_prompt_length 'x': expected a whole number of tokens" in capsys.readouterr().err


async def test_agl_view_without_a_key_answers_only_its_own_pages_on_loopback_names(tmp_path: Path) -> None:
    async with SQLiteStore(str(tmp_path / "agl.db")) as store:
        await write_rollout(store, CALLS)
    async with (
        running_agl("view", "--store", f"sqlite:///{tmp_path / 'agl.db'}") as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        own = await http.get("/view/api/rollouts", headers={"origin": url})
        assert own.json()["total"] == 1 and own.headers["x-content-type-options"] == "nosniff"
        assert (await http.get("/view/api/rollouts", headers={"host": "localhost"})).status_code == 200
        # Another site's page, and one whose host name was rebound to 127.0.0.1, read nothing.
        foreign = await http.get("/view/api/rollouts", headers={"origin": "https://evil.example"})
        assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "cross_origin"
        rebound = await http.get("/view/api/rollouts", headers={"host": "evil.example"})
        assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "forbidden_host"
