"""The packages' import costs and directions, checked the way a reader would.

`agl store serve` on the base install must not pay for the trainer's or the proxy's heavy
dependencies, and no package imports one that depends on it: agl_store imports neither
agl_proxy nor agl_train, agl_proxy does not import agl_train, and none of them imports the
repository's examples, benchmarks or tests (an installed agl has none of those). Within them,
module by module: no import circle, and the subpackages of agl_train and of agl_proxy import
only the layers below their own (`TRAIN_LAYERS`, `PROXY_LAYERS`).
"""

from __future__ import annotations

import ast
import importlib.abc
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

import pytest

from agl_proxy._moved import MOVED as PROXY_MOVED
from agl_store.moved_modules import MovedModuleFinder
from agl_train import _moved as train_moved
from agl_train._moved import MOVED

REPO_ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "vllm", "litellm", "verl", "transformers")
CHECKOUT_ONLY = ("examples", "benchmarks", "tests")
FORBIDDEN = {
    "agl_store": ("agl_proxy", "agl_train", *CHECKOUT_ONLY),
    "agl_proxy": ("agl_train", *CHECKOUT_ONLY),
    "agl_train": CHECKOUT_ONLY,
}
AGL_PACKAGES = tuple(FORBIDDEN)
# agl_train's subpackages, lowest first: a module imports modules of its own subpackage or of a
# lower layer, never of its layer's siblings or above. What each needs:
#   core       spans to rows: the store's interface only
#   algo       advantages, loss, tensors: core's rows (torch)
#   runner     rollouts, groups, the proxy's control, retention: the store only
#   view       the web view: core's rows, runner's outcome metadata and LLM resource name
#   verl_glue  the trainer on verl: all of the above except the view
#   command    `agl train`: a run file checked, vLLM and the proxy started, the trainer run (all of the above)
TRAIN_LAYERS: tuple[tuple[str, ...], ...] = (("core",), ("algo",), ("runner",), ("view", "verl_glue"), ("command",))
# agl_proxy's subpackages, lowest first, under the same rule:
#   common     errors, deployments, credentials, metrics
#   controls   the trainer's controls: the pause gate, sampling by mode
#   recording  a call recorded, its span, its sequence number, the exporter
#   translate  the Responses and Messages APIs over chat completions
#   backends   the Backend interface, the pass-through, LiteLLM, replicas, the HTTP client
#   chain      the token chain (a backend; remembers calls by their translated requests)
#   server     the app, a call's endpoint, state, settings, LLMProxy, the CLI
PROXY_LAYERS: tuple[tuple[str, ...], ...] = (
    ("common",),
    ("controls",),
    ("recording",),
    ("translate", "backends"),
    ("chain",),
    ("server",),
)
LAYERS = {"agl_train": TRAIN_LAYERS, "agl_proxy": PROXY_LAYERS}


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
        if module.split(".")[0] == "verl" and path.relative_to(REPO_ROOT).as_posix() != "agl_train/verl_glue/_verl.py"
    ]
    assert direct == []
    assert "verl.workers.engine_workers" in {module for _, _, module in imports("agl_train")}


def test_the_training_core_imports_neither_torch_nor_verl() -> None:
    heavy = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {module}"
        for path, line, module in imports("agl_train/core")
        if module.split(".")[0] in HEAVY
    ]
    assert heavy == []


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module of `packages` → the modules of `packages` it imports: absolute and relative
    imports, at the top or inside a function (a deferred import still makes a circle in the design;
    deferring it only moves the failure from import time to call time), `TYPE_CHECKING` ones too.
    `from package import name` counts as importing `package.name` where that is a module."""
    paths = {module_name(path): path for package in packages for path in sorted((REPO_ROOT / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                package = here[: len(here) - node.level + 1] if node.level else []
                base = ".".join([*package, *([node.module] if node.module else [])])
                named = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names]
            else:
                continue
            for name in named:
                while name and name not in paths:  # `agl_store.models.Span` → `agl_store.models`
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def find_cycle(graph: Mapping[str, Set[str]]) -> list[str] | None:
    """One import circle of `graph` as [a, b, ..., a], or None (depth first, without recursion)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path = [start]
        pending = [iter(sorted(graph[start]))]
        while pending:
            target = next(pending[-1], None)
            if target is None:
                pending.pop()
                done.add(path.pop())
            elif target in path:
                return [*path[path.index(target) :], target]
            elif target in graph and target not in done:
                path.append(target)
                pending.append(iter(sorted(graph[target])))
    return None


def layer_of(module: str) -> int | None:
    """The index in its package's layers (`LAYERS`) of a module's subpackage; None for the
    package's own modules (`agl_train`, `agl_proxy._moved`), which sit above every layer."""
    package, *parts = module.split(".")
    for index, layer in enumerate(LAYERS[package]):
        if parts and parts[0] in layer:
            return index
    return None


def upward_imports(graph: Mapping[str, Set[str]]) -> list[str]:
    """Imports from a layered package's subpackage to a sibling or higher layer of the same
    package, or to the package's own modules."""
    found = []
    for module, targets in sorted(graph.items()):
        package = module.split(".")[0]
        layer = layer_of(module)
        if layer is None:
            continue
        for target in sorted(target for target in targets if target.split(".")[0] == package):
            if target.split(".")[1] == module.split(".")[1]:
                continue  # within one subpackage
            target_layer = layer_of(target)
            if target_layer is None or target_layer >= layer:
                found.append(f"{module} imports {target}")
    return found


def test_no_module_import_circle() -> None:
    assert find_cycle(module_graph(AGL_PACKAGES)) is None


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_layers_import_only_downward(package: str) -> None:
    assert upward_imports(module_graph((package,))) == []


@pytest.mark.parametrize(
    ("package", "own_modules"),
    [("agl_train", {"agl_train", "agl_train._moved"}), ("agl_proxy", {"agl_proxy", "agl_proxy._moved"})],
)
def test_every_module_lies_in_a_layer(package: str, own_modules: set[str]) -> None:
    # A new module directly in the package would sit outside the layers the test above checks.
    outside = {module for module in module_graph((package,)) if layer_of(module) is None}
    assert outside == own_modules


def test_the_graph_checks_catch_a_planted_circle_and_upward_import() -> None:
    graph = module_graph(AGL_PACKAGES)
    assert "agl_train.runner.groups" in graph["agl_train.verl_glue.trainer"]  # a relative import, read
    assert "agl_train.core.aggregate" in graph["agl_train.view.token_view"]  # `from ..core.aggregate`
    assert "agl_store.models" in graph["agl_train.core.traces"]  # an absolute one
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    planted = {
        "agl_train.core.traces": {"agl_train.verl_glue.step"},
        "agl_train.view.routes": {"agl_train.verl_glue.config", "agl_train.core.aggregate"},
        "agl_train.verl_glue.step": {"agl_train.core.traces", "agl_train.runner.groups"},
    }
    assert upward_imports(planted) == [
        "agl_train.core.traces imports agl_train.verl_glue.step",
        "agl_train.view.routes imports agl_train.verl_glue.config",
    ]
    assert find_cycle(planted) == ["agl_train.core.traces", "agl_train.verl_glue.step", "agl_train.core.traces"]


def test_the_proxy_checks_catch_a_planted_circle_and_upward_import() -> None:
    graph = {module: set(targets) for module, targets in module_graph(("agl_proxy",)).items()}
    assert "agl_proxy.chain.links" in graph["agl_proxy.chain.backend"]  # `from .links import`
    assert "agl_proxy.backends.base" in graph["agl_proxy.chain.backend"]  # `from ..backends.base import`
    assert upward_imports(graph) == [] and find_cycle(graph) is None
    graph["agl_proxy.common.errors"].add("agl_proxy.server.calls")  # the lowest layer importing the highest
    graph["agl_proxy.backends.forwarding"].add("agl_proxy.translate.base")  # a sibling layer
    assert upward_imports(graph) == [
        "agl_proxy.backends.forwarding imports agl_proxy.translate.base",
        "agl_proxy.common.errors imports agl_proxy.server.calls",
    ]
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and "agl_proxy.common.errors" in cycle


@pytest.mark.parametrize(
    ("moved", "finder", "old", "new", "unmoved"),
    [
        (
            MOVED,
            train_moved.MovedModuleFinder(),
            "agl_train.entry",
            "agl_train.verl_glue.entry",
            "agl_train.core.traces",
        ),
        (
            PROXY_MOVED,
            MovedModuleFinder(PROXY_MOVED),
            "agl_proxy.token_chain",
            "agl_proxy.chain.backend",
            "agl_proxy.chain.links",
        ),
    ],
    ids=["agl_train", "agl_proxy"],
)
def test_an_old_module_path_names_its_new_one(
    moved: Mapping[str, str], finder: importlib.abc.MetaPathFinder, old: str, new: str, unmoved: str
) -> None:
    # The finder called directly: a checkout beside an editable install may find the old file elsewhere.
    assert moved[old] == new
    with pytest.raises(ModuleNotFoundError, match=rf"^{re.escape(old)} moved to {re.escape(new)}: "):
        finder.find_spec(old, None)
    assert finder.find_spec(unmoved, None) is None
    new_paths = [REPO_ROOT / (path.split(" ")[0].replace(".", "/") + ".py") for path in moved.values()]
    assert [path for path in new_paths if not path.is_file()] == []
    # `import agl_train` / `import agl_proxy` put the finder there
    assert any(type(installed) is type(finder) for installed in sys.meta_path)


def test_the_proxys_public_names_and_cli_keep_working() -> None:
    script = (
        "import agl_proxy\n"
        "from agl_proxy import LLMProxy, ProxyError, ProxySettings\n"
        "from agl_store.cli import main\n"
        "try:\n"
        "    import agl_proxy.cli\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error)\n"
        "main(['proxy', 'serve', '--help'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.stdout.startswith("agl_proxy.cli moved to agl_proxy.server.cli: import it from there\n"), done.stderr
    assert "usage: agl proxy serve" in done.stdout
