"""A rollout's agent environment: env_map paths into the input, agl's variables, the result line."""

from __future__ import annotations

import pytest

from agl_train.runner.env import MissingInputField, RolloutEndpoints, parse_result, rollout_env

ENDPOINTS = RolloutEndpoints(
    base_url="http://127.0.0.1:8080/rollout/ro-1/attempt/at-1/v1",
    model="tiny",
    key="k",
    store_url="http://127.0.0.1:8080",
)


def test_env_map_reads_dotted_paths_and_agl_adds_ids_urls_and_key() -> None:
    task = {"question": "What is 2 + 2?", "meta": {"level": 3, "tags": ["a", "b"]}}
    env = rollout_env(
        "ro-1",
        "at-1",
        task,
        {"QUESTION": "input.question", "LEVEL": "input.meta.level", "TAG": "input.meta.tags.1"},
        ENDPOINTS,
    )

    assert (env["QUESTION"], env["LEVEL"], env["TAG"]) == ("What is 2 + 2?", "3", "b")
    assert env["AGL_BASE_URL"] == env["OPENAI_BASE_URL"] == ENDPOINTS.base_url
    assert (env["AGL_ROLLOUT_ID"], env["AGL_ATTEMPT_ID"], env["AGL_KEY"], env["OPENAI_API_KEY"]) == (
        "ro-1",
        "at-1",
        "k",
        "k",
    )
    assert (env["AGL_MODEL"], env["AGL_STORE_URL"]) == ("tiny", "http://127.0.0.1:8080")


def test_a_missing_field_names_the_path() -> None:
    with pytest.raises(MissingInputField, match="input.answer"):
        rollout_env("ro-1", "at-1", {"question": "q"}, {"ANSWER": "input.answer"}, ENDPOINTS)
    with pytest.raises(MissingInputField, match="must start with 'input.'"):
        rollout_env("ro-1", "at-1", {"question": "q"}, {"Q": "question"}, ENDPOINTS)


def test_without_a_key_the_openai_sdk_still_gets_one() -> None:
    env = rollout_env("ro-1", "at-1", {}, {}, RolloutEndpoints(base_url="http://x/v1", model="m"))
    assert env["OPENAI_API_KEY"] and env["AGL_KEY"] == ""
    assert "AGL_STORE_URL" not in env


def test_the_last_result_line_wins() -> None:
    out = 'noise\nAGL_RESULT {"reward": 0.0}\nmore noise\nAGL_RESULT {"reward": 1.0}\n'
    assert parse_result(out) == {"reward": 1.0}
    assert parse_result("no result here") is None
    assert parse_result("AGL_RESULT not json") is None
