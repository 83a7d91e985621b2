"""agl_store.packed_attributes: int arrays stored as binary, read back as the same plain lists."""

from __future__ import annotations

import random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_store.bounds import MAX_JSON_DEPTH
from agl_store.errors import InvalidInputError
from agl_store.packed_attributes import MIN_PACKED_LENGTH, pack_attributes, unpack_attributes


def round_trip(attributes: dict) -> dict:
    return unpack_attributes(*pack_attributes(attributes))


def int_bytes(blob: bytes | None) -> int:
    """Bytes of int32 data in a blob (after its one-line index)."""
    assert blob is not None
    return len(blob) - blob.index(b"\n") - 1


def test_an_llm_call_span_round_trips_with_token_ids_in_the_blob() -> None:
    rng = random.Random(0)
    prompt = [rng.randrange(151_000) for _ in range(2000)]
    attributes = {
        "agl.request": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "return_token_ids": True},
        "agl.response": {"choices": [{"index": 0, "token_ids": list(range(64)), "message": {"content": "ok"}}]},
        "agl.prompt_token_ids": prompt,
        "agl.choices": [{"index": 0, "token_ids": list(range(64)), "logprobs": [-0.25] * 64}],
    }

    skeleton, blob = pack_attributes(attributes)

    assert unpack_attributes(skeleton, blob) == attributes
    assert int_bytes(blob) == 4 * (2000 + 64)  # the output ids, named twice, are stored once
    assert b'agl.prompt_token_ids":null' in skeleton  # the ids left the JSON


def test_binary_ids_are_much_smaller_than_json() -> None:
    # Ids of a 151k vocabulary as the proxy records them: JSON spends ~6.9 bytes per id
    # ("123456," plus spaces in some writers), the blob 4, so packed/JSON is about 0.58
    # here (1 / 1.7); with Python's `json.dumps` spacing it is 1 / 2.0.
    rng = random.Random(1)
    ids = [rng.randrange(100_000, 151_000) for _ in range(4096)]
    as_json = len(orjson.dumps({"ids": ids}))

    skeleton, blob = pack_attributes({"ids": ids})
    packed = len(skeleton) + len(blob or b"")

    assert packed / as_json < 0.62


def test_attributes_without_int_arrays_are_plain_json() -> None:
    attributes = {"a": [1, 2, 3], "b": "text", "c": [0.5] * 20, "d": {"e": None}}

    skeleton, blob = pack_attributes(attributes)

    assert blob is None and orjson.loads(skeleton) == attributes


@pytest.mark.parametrize(
    "value",
    [
        [True, False] * 8,  # bools are not ints here
        [1] * 7 + [1.5],  # mixed numbers stay JSON
        [1] * 7 + ["1"],
        [2**31] + [0] * 10,  # beyond int32: JSON keeps it exact
        [-(2**31) - 1] + [0] * 10,
        [2**63] * 9,  # beyond int64 too, still within what JSON (orjson) keeps exact
        [],
        [[1] * 9, [2] * 9],  # nested lists of ints are packed one by one
    ],
)
def test_edge_values_round_trip(value: list) -> None:
    assert round_trip({"v": value, "deep": [{"v": value}]}) == {"v": value, "deep": [{"v": value}]}


def test_int32_extremes_and_lengths_around_the_threshold_round_trip() -> None:
    extremes = [-(2**31), 2**31 - 1, 0, -1, 1] * 3
    short = list(range(MIN_PACKED_LENGTH - 1))
    exact = list(range(MIN_PACKED_LENGTH))

    skeleton, blob = pack_attributes({"x": extremes, "s": short, "e": exact})

    assert unpack_attributes(skeleton, blob) == {"x": extremes, "s": short, "e": exact}
    assert int_bytes(blob) == 4 * (len(extremes) + len(exact))


def test_ints_beyond_64_bits_are_not_json_here() -> None:
    # orjson, and so the store, keeps ints exact up to 64 bits and refuses larger ones
    # rather than silently turning them into floats.
    with pytest.raises(TypeError):
        pack_attributes({"v": [2**70] * 9})


def test_one_list_recorded_under_two_names_is_stored_once() -> None:
    prompt = list(range(1000, 1300))
    attributes = {"agl.response": {"prompt_token_ids": prompt}, "agl.prompt_token_ids": prompt}

    skeleton, blob = pack_attributes(attributes)

    assert int_bytes(blob) == 4 * 300
    read = unpack_attributes(skeleton, blob)
    assert read == attributes
    assert read["agl.prompt_token_ids"] is not read["agl.response"]["prompt_token_ids"]  # safe to mutate


def test_tuples_come_back_as_lists() -> None:
    assert round_trip({"t": tuple(range(10)), "u": (1, 2)}) == {"t": list(range(10)), "u": [1, 2]}


def test_unusual_keys_strings_and_positions_round_trip() -> None:
    attributes = {
        "": list(range(9)),
        "line\nbreak": {"\x00": list(range(9)), "0": "a\nb"},
        "rows": [[list(range(8)), "x"], list(range(8))],
        "text": "[1,2,3,4,5,6,7,8,9]",
    }

    skeleton, blob = pack_attributes(attributes)

    assert unpack_attributes(skeleton, blob) == attributes
    assert int_bytes(blob) == 4 * (9 + 8)  # equal arrays are stored once


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=12)
        | st.lists(st.integers(min_value=-(2**33), max_value=2**33), min_size=0, max_size=40)
        | st.dictionaries(st.text(max_size=8), children, max_size=6)
    ),
    max_leaves=60,
)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_any_json_attributes_round_trip(attributes: dict) -> None:
    assert round_trip(attributes) == attributes


def test_attributes_nested_past_the_depth_limit_are_refused_on_the_packing_walk() -> None:
    def nested(depth: int, leaf: object) -> dict:
        value = leaf
        for level in range(depth - 1):
            value = [value] if level % 2 else {"k": value}
        return {"top": value}

    ids = list(range(10))
    at_limit = nested(MAX_JSON_DEPTH - 1, ids)  # the id list is the deepest, 128th level
    assert round_trip(at_limit) == at_limit
    for too_deep in (nested(MAX_JSON_DEPTH, ids), nested(MAX_JSON_DEPTH, []), nested(5_000, 1)):
        with pytest.raises(InvalidInputError, match=f"attributes nests deeper than {MAX_JSON_DEPTH} levels"):
            pack_attributes(too_deep)
