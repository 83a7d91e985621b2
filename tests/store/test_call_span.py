"""agl_store.call_span: the names in the module are the attributes docs/spans.md describes."""

from __future__ import annotations

import re
from pathlib import Path

from agl_store import call_span

SPANS_DOC = Path(__file__).resolve().parents[2] / "docs" / "spans.md"


def documented_call_attributes() -> set[str]:
    section = SPANS_DOC.read_text().split("## Attributes of `agl.llm_call`")[1].split("\n## ")[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE))


def module_attributes() -> set[str]:
    return {value for name, value in vars(call_span).items() if name.isupper() and name != "NAME"}


def test_every_documented_attribute_has_a_name_in_the_module_and_no_other() -> None:
    assert documented_call_attributes() == module_attributes()


def test_the_span_name_is_the_documented_one() -> None:
    assert f"| `{call_span.NAME}` |" in SPANS_DOC.read_text()
