"""The lint and type gates (`scripts/check.sh`, run by the test command before pytest) fail on a finding.

Each case runs the gate script on a scratch project that has the repository's pyproject.toml (the same
ruff and mypy settings) and three tiny packages named like agl's.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CHECK = REPO_ROOT / "scripts" / "check.sh"
CLEAN = 'def greeting(name: str) -> str:\n    return f"hello {name}"\n'


def project(tmp_path: Path, agl_store_code: str) -> Path:
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for package in ("agl_store", "agl_proxy", "agl_train"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(CLEAN)
    (tmp_path / "agl_store" / "__init__.py").write_text(agl_store_code)
    return tmp_path


def check(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHECK, directory], capture_output=True, text=True, timeout=300)


def test_a_clean_project_passes_both_gates(tmp_path: Path) -> None:
    done = check(project(tmp_path, CLEAN))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[lint]" in done.stdout and "[types]" in done.stdout


def test_a_lint_finding_fails_before_the_type_gate(tmp_path: Path) -> None:
    done = check(project(tmp_path, "import os\n" + CLEAN))
    assert done.returncode != 0
    assert "F401" in done.stdout + done.stderr
    assert "[types]" not in done.stdout


def test_code_ruff_would_reformat_fails(tmp_path: Path) -> None:
    done = check(project(tmp_path, CLEAN.replace("(name: str)", "( name:str )")))
    assert done.returncode != 0
    assert "Would reformat: agl_store/__init__.py" in done.stdout + done.stderr


def test_a_type_error_fails_the_type_gate(tmp_path: Path) -> None:
    done = check(project(tmp_path, 'def count() -> int:\n    return "three"\n'))
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'agl_store/__init__.py:2: error: Incompatible return value type (got "str", expected "int")' in done.stdout
