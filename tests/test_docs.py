"""Every repository path, agl module name and relative link the docs cite exists.

Paths: backticked or linked text with a `/` that starts at a top-level folder of the repository
(`agl_train/config.yaml`, `examples/calc_agent/`, `tests/train/test_fit_cpu.py::test_x`). Modules:
dotted names under agl's packages, `examples`, `tests` or `benchmarks`
(`agl_train.verl_glue.cpu_run.run_ppo_on_cpu`,
`examples.calc_agent.agent:CalcAgent`); the module must exist and define the names after it, read from its
source without importing it (no torch or verl to load). Relative links: the file, and the heading an
anchor names.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [REPO_ROOT / "README.md", REPO_ROOT / "CONTRIBUTING.md", REPO_ROOT / "benchmarks" / "README.md"]
    + list((REPO_ROOT / "docs").glob("*.md"))
)
PACKAGES = ("agl_store", "agl_proxy", "agl_train", "examples", "tests", "benchmarks")
TOP_FOLDERS = (*PACKAGES, "docs", "scripts", "requirements")

CITED = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"^(?:\./)?((?:" + "|".join(TOP_FOLDERS) + r")(?:/[\w.\-]+)*/?)(?:::[\w\[\]\-]+)?(?::\d+)?$")
MODULE = re.compile(r"^((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)(?::(\w+(?:\.\w+)*))?(?:\(.*\))?$")


def citations(doc: Path, pattern: re.Pattern[str] = CITED) -> list[tuple[int, str]]:
    """(line, text) of each backticked span (or link target) of `doc`, code blocks included."""
    found = []
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        for match in pattern.finditer(line):
            found.append((number, match[1].strip()))
    return found


@cache
def anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives `doc`'s headings: lower case, punctuation dropped, spaces to hyphens."""
    slugs = set()
    for line in doc.read_text(encoding="utf-8").splitlines():
        if heading := re.match(r"^#+\s+(.*)$", line):
            slugs.add(re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-"))
    return slugs


def link_problem(doc: Path, target: str) -> str | None:
    """What is wrong with a relative link of `doc` (a missing file, or a heading its anchor names), else None."""
    if "://" in target or target.startswith("mailto:"):
        return None
    path_part, _, anchor = target.partition("#")
    path = (doc.parent / path_part).resolve() if path_part else doc
    if not path.exists():
        return f"links to {path_part!r}, which does not exist"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"links to #{anchor}, which is no heading of {path.relative_to(REPO_ROOT)}"
    return None


@cache
def module_source(dotted: str) -> tuple[Path, ast.Module] | None:
    base = REPO_ROOT.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path, ast.parse(path.read_text(encoding="utf-8"))
    return None


def defined_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Top-level names a module or class body defines (functions, classes, assignments, imports)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            names.update(defined_names(node.body))
    return names


def missing_module_part(dotted: str) -> str | None:
    """None when `dotted` names an existing module, or names defined in one; else what is missing."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        found = module_source(".".join(parts[:cut]))
        if found is None:
            continue
        path, tree = found
        body: list[ast.stmt] = tree.body
        for name in parts[cut:]:
            node = defined_names(body).get(name)
            if node is None:
                return f"{name!r} is not defined in {path.relative_to(REPO_ROOT)}"
            if isinstance(node, ast.ClassDef):
                body = node.body
            else:
                break  # an attribute of a function's result or an instance: not checked
        return None
    return f"no module {parts[0]}"


def problems(doc: Path) -> list[str]:
    found = []
    for line, text in citations(doc):
        if any(mark in text for mark in ("*", "<", "{", "$", " ")):
            continue  # globs, placeholders, commands
        if path := PATH.match(text):
            if not (REPO_ROOT / path[1]).exists():
                found.append(f"{doc.relative_to(REPO_ROOT)}:{line}: cites {path[1]!r}, which does not exist")
        elif module := MODULE.match(text):
            dotted = module[1] + (f".{module[2]}" if module[2] else "")
            if (why := missing_module_part(dotted)) is not None:
                found.append(f"{doc.relative_to(REPO_ROOT)}:{line}: cites {text!r}: {why}")
    for line, target in citations(doc, LINK):
        if (why := link_problem(doc, target)) is not None:
            found.append(f"{doc.relative_to(REPO_ROOT)}:{line}: {why}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(REPO_ROOT)))
def test_every_path_and_module_the_doc_cites_exists(doc: Path) -> None:
    found = problems(doc)
    assert not found, "stale citations (doc:line: what):\n" + "\n".join(found)


def test_the_checks_see_what_the_docs_cite() -> None:
    assert PATH.match("agl_train/config.yaml") and PATH.match("tests/train/test_fit_cpu.py::test_fit")
    assert MODULE.match("examples.calc_agent.agent:CalcAgent") and MODULE.match(
        "agl_train.verl_glue.entry.run_ppo(config)"
    )
    assert missing_module_part("agl_train.verl_glue.cpu_run.run_ppo_on_cpu") is None
    assert missing_module_part("agl_train.runner.dispatch.RolloutDispatcher.for_settings") is None
    assert missing_module_part("agl_train.nowhere") == "'nowhere' is not defined in agl_train/__init__.py"
    assert missing_module_part("agl_train.verl_glue.config.no_such_function") is not None
    readme = REPO_ROOT / "benchmarks" / "README.md"
    assert link_problem(REPO_ROOT / "README.md", "benchmarks/README.md#figures") is None
    assert "figures" in anchors(readme) and "store_benchpy-2026-11-30" in anchors(readme)
    assert link_problem(REPO_ROOT / "README.md", "benchmarks/README.md#no-such-heading") is not None
