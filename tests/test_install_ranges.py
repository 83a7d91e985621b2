"""pyproject.toml declares ranges; the exact versions tested live in requirements/*.txt and must satisfy them.

So `pip install -e .[train,proxy]` on top of requirements/gpu.txt (verl 0.9.1's GPU stack, torch 2.11) or
requirements/test.txt (the CPU test venv, torch 2.13) has nothing to change. scripts/check_gpu_install.sh runs
pip's resolver on the same question (needs the package index).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO_ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def agl_requirements(extras: tuple[str, ...]) -> list[Requirement]:
    lines = PYPROJECT["dependencies"] + [line for extra in extras for line in PYPROJECT["optional-dependencies"][extra]]
    return [Requirement(line) for line in lines]


def pins(path: Path) -> dict[str, Version]:
    """name → the version a requirements file pins with `==` (extras dropped)."""
    pinned = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s#;]+)", line)
        if match:
            pinned[canonicalize_name(match[1])] = Version(match[3])
    return pinned


@pytest.mark.parametrize(
    "requirements_file, extras, must_pin_all",
    [
        ("requirements/gpu.txt", ("train", "proxy"), False),  # hydra-core, numpy: as verl's stack resolves them
        ("requirements/test.txt", ("train", "proxy", "dev"), True),  # a full freeze
    ],
)
def test_the_pinned_stacks_satisfy_pyprojects_ranges(requirements_file, extras, must_pin_all) -> None:
    pinned = pins(REPO_ROOT / requirements_file)
    for requirement in agl_requirements(extras):
        version = pinned.get(canonicalize_name(requirement.name))
        if version is None:
            assert not must_pin_all, f"{requirements_file} does not pin {requirement.name}"
            continue
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{requirements_file} pins {requirement.name}=={version}, outside pyproject.toml's {requirement}: "
            f"installing agl there would replace it"
        )


def test_pyproject_pins_nothing_a_users_verl_environment_would_have_to_replace() -> None:
    for requirement in agl_requirements(("train", "proxy")):
        exact = [spec for spec in requirement.specifier if spec.operator in ("==", "===")]
        assert not exact, f"pyproject.toml pins {requirement}: declare the compatible range, pin in requirements/"
    torch = next(r for r in agl_requirements(("train",)) if r.name == "torch")
    assert torch.specifier.contains("2.11.0") and torch.specifier.contains("2.13.0")
