"""agl_store.bounds: the integer range and JSON depth the store takes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from agl_store.bounds import MAX_INTEGER, MAX_JSON_DEPTH, check_integer, check_json_depth
from agl_store.errors import InvalidInputError


class Box(BaseModel):
    model_config = ConfigDict(extra="allow")

    inside: Any = None


@dataclasses.dataclass
class Pair:
    left: Any
    right: Any = None


def test_integers_up_to_2_to_the_53_minus_1_pass() -> None:
    assert check_integer(MAX_INTEGER, "limit") == MAX_INTEGER
    with pytest.raises(InvalidInputError, match="limit must be at most 9007199254740991"):
        check_integer(MAX_INTEGER + 1, "limit")


@pytest.mark.parametrize(
    "wrap",
    [
        lambda v: {"k": v},
        lambda v: [v],
        lambda v: (v,),
        lambda v: Box(inside=v),
        lambda v: Box(extra_field=v),  # extra fields are JSON too
        lambda v: Pair(left=1, right=v),
    ],
)
def test_depth_counts_every_kind_of_container(wrap: Any) -> None:
    def nested(depth: int) -> Any:
        value: Any = "leaf"
        for _ in range(depth):
            value = wrap(value)
        return value

    check_json_depth(nested(MAX_JSON_DEPTH), "input")
    with pytest.raises(InvalidInputError, match=f"input nests deeper than {MAX_JSON_DEPTH} levels"):
        check_json_depth(nested(MAX_JSON_DEPTH + 1), "input")
    with pytest.raises(InvalidInputError):
        check_json_depth(nested(10_000), "input")  # refused without walking it all: no RecursionError


def test_long_flat_lists_are_one_level() -> None:
    check_json_depth({"ids": list(range(100_000)), "empty": [], "nothing": {}}, "attributes")
