"""The `agl` command line: `agl store serve`, and command groups discovered as plugins."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agl_store import cli
from agl_store.client import LightningStoreClient
from agl_store.opening import db_url

from .http_server import REPO_ROOT, StoreServerProcess


def test_db_paths_become_sqlite_urls_and_urls_pass_through() -> None:
    assert db_url("runs/agl.db") == "sqlite:///runs/agl.db"
    assert db_url("/abs/agl.db") == "sqlite:////abs/agl.db"
    assert db_url("memory://") == "memory://"


def test_store_serve_defaults() -> None:
    args = cli.build_parser().parse_args(["store", "serve"])
    assert (args.db, args.host, args.port, args.key) == ("agl.db", "127.0.0.1", 4747, None)


def test_command_groups_come_from_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def add_demo(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
        demo = subparsers.add_parser("demo")
        demo.set_defaults(run=lambda args: seen.append("ran") or 0)

    class FakeEntryPoint:  # what importlib.metadata yields for a plugin
        name = "demo"

        def load(self) -> object:
            return add_demo

    monkeypatch.setattr(cli, "entry_points", lambda group: [FakeEntryPoint()] if group == "agl.commands" else [])
    assert cli.main(["demo"]) == 0
    assert seen == ["ran"]


class BrokenEntryPoint:
    """A plug-in whose dependency is not installed: importing it raises like a missing `litellm` would."""

    name = "proxy"
    value = "agl_proxy.server.cli:add_proxy_commands"

    def load(self) -> object:
        raise ModuleNotFoundError("No module named 'litellm'", name="litellm")


def test_a_group_that_fails_to_import_is_an_error_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [BrokenEntryPoint()])
    assert cli.main(["proxy", "serve"]) == 2
    err = capsys.readouterr().err
    assert "agl proxy: cannot import agl_proxy.server.cli:add_proxy_commands: No module named 'litellm'" in err
    assert "pip install 'agl[proxy]'" in err


def test_store_commands_work_when_another_group_cannot_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [BrokenEntryPoint()])
    args = cli.build_parser("store").parse_args(["store", "serve", "--port", "0"])
    assert args.port == 0
    with pytest.raises(cli.CommandGroupError):
        cli.build_parser()  # every group: the broken one is not skipped silently


def test_agl_help_lists_the_groups_without_importing_them() -> None:
    script = (
        "import sys\n"
        "from agl_store.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('agl_proxy', 'agl_train')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "proxy" in done.stdout and "view" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_agl_help_lists_store(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "agl_store.cli", "--help"], capture_output=True, text=True, check=True)
    assert "store" in done.stdout


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "agl_store.cli",
                "store",
                "serve",
                "--db",
                str(tmp_path / "x.db"),
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr


def test_an_unknown_store_url_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agl_store.cli", "store", "serve", "--db", "postgres://db/agl", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "cannot open the store postgres://db/agl: unknown store URL scheme 'postgres'" in done.stderr


async def test_serve_prints_one_line_at_start_and_stop_and_keeps_data(tmp_path: Path) -> None:
    db = tmp_path / "nested" / "agl.db"
    server = StoreServerProcess(db)
    url = await server.start()
    async with LightningStoreClient(url) as store:
        rollout = await store.enqueue_rollout(input={"hello": "world"})
    assert await server.stop() == 0
    assert server.output[0] == f"agl store serve: listening on {url} (store sqlite:///{db}, no key)"
    assert server.output[-1] == "agl store serve: stopped"
    assert db.exists()

    again = StoreServerProcess(f"sqlite:///{db}")
    async with LightningStoreClient(await again.start()) as store:
        assert (await store.get_rollout_by_id(rollout.rollout_id)) == rollout
    await again.stop()


async def test_ctrl_c_stops_the_server_as_gracefully_as_sigterm(tmp_path: Path) -> None:
    server = StoreServerProcess(tmp_path / "agl.db")
    async with LightningStoreClient(await server.start()) as store:
        await store.enqueue_rollout(input={"hello": "world"})
    assert await server.interrupt() == 0
    assert server.output[-1] == "agl store serve: stopped"


async def test_serve_in_memory(tmp_path: Path) -> None:
    server = StoreServerProcess("memory://", key="k")
    async with LightningStoreClient(await server.start(), key="k") as store:
        assert (await store.statistics()).database_bytes is None
    await server.stop()
    assert "bearer key required" in server.output[0]


async def test_the_key_can_come_from_a_file_or_the_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "store.key"
    key_file.write_text("from-file\n")
    by_file = StoreServerProcess("memory://", extra_args=["--key-file", str(key_file)])
    by_env = StoreServerProcess("memory://", env={"AGL_STORE_KEY": "from-env"})
    for server, key in ((by_file, "from-file"), (by_env, "from-env")):
        url = await server.start()
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/v1/agl/statistics")).status_code == 401
            assert (await http.get("/v1/agl/statistics", headers={"authorization": f"Bearer {key}"})).status_code == 200
        await server.stop()
        assert key not in server.output[0] and "bearer key required (from " in server.output[0]


def test_an_empty_key_file_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    done = subprocess.run(
        [sys.executable, "-m", "agl_store.cli", "store", "serve", "--db", "memory://", "--key-file", str(empty)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 2 and f"--key-file {empty} is empty" in done.stderr
