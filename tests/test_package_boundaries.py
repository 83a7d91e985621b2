"""The packages' import costs and directions, checked the way a reader would.

`agl store serve` on the base install must not pay for the trainer's or the proxy's heavy
dependencies, and no package imports one that depends on it: agl_store imports neither
agl_proxy nor agl_train, agl_proxy does not import agl_train, and none of them imports the
repository's examples, benchmarks or tests (an installed agl has none of those).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "vllm", "litellm", "verl", "transformers")
CHECKOUT_ONLY = ("examples", "benchmarks", "tests")
FORBIDDEN = {
    "agl_store": ("agl_proxy", "agl_train", *CHECKOUT_ONLY),
    "agl_proxy": ("agl_train", *CHECKOUT_ONLY),
    "agl_train": CHECKOUT_ONLY,
}


def test_store_serve_imports_no_heavy_dependency(tmp_path: Path) -> None:
    # A fresh interpreter: this test process has imported torch and litellm already.
    script = f"""
import asyncio, sys
from agl_store.cli import build_parser
from agl_store.opening import open_store
from agl_store.server import create_app

args = build_parser("store").parse_args(["store", "serve", "--db", {str(tmp_path / "agl.db")!r}])
store = asyncio.run(open_store("sqlite:///" + args.db))
app = create_app(store, page_settings={{"view": {{"level": "transition"}}}})  # the web view plug-in included
assert "/view/app.js" in app.state.open_paths, sorted(app.state.open_paths)
asyncio.run(store.close())
print(sorted({{name.split(".")[0] for name in sys.modules}} & set({HEAVY!r})))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_importing_agl_train_imports_neither_torch_nor_verl() -> None:
    script = (
        "import sys, agl_train, agl_train.runner\n"
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'torch', 'verl'}))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert done.stdout.strip() == "[]"


def test_the_store_client_imports_no_server() -> None:
    # Runners and the trainer hold a client; the server's routes and OTLP decoding are not theirs to load.
    script = "import sys, agl_store.client\nprint(sorted(n for n in sys.modules if n.startswith('agl_store.server')))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert done.stdout.strip() == "[]"


def imports(package: str) -> Iterator[tuple[Path, int, str]]:
    """(file, line, imported module) of every absolute import in `package`'s source."""
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, node.lineno, alias.name
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield path, node.lineno, node.module


def test_no_package_imports_upward() -> None:
    upward = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {module}"
        for package, forbidden in FORBIDDEN.items()
        for path, line, module in imports(package)
        if module.split(".")[0] in forbidden
    ]
    assert upward == []


def test_the_check_reads_the_real_imports() -> None:
    assert "agl_store.web.http_transport" in {module for _, _, module in imports("agl_proxy")}


def test_agl_train_imports_verl_only_through_its_verl_module() -> None:
    # agl_train/verl_glue/_verl.py imports verl with its import-time warnings silenced, in one place.
    direct = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {module}"
        for path, line, module in imports("agl_train")
        if module.split(".")[0] == "verl" and path.name != "_verl.py"
    ]
    assert direct == []
    assert "verl.workers.engine_workers" in {module for _, _, module in imports("agl_train")}
