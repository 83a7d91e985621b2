"""The training page's API on a real store server: steps from published resource sets, rewards,
outcomes, rows and trained tokens; the published model's tokenizer; the call's API and token-id status."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from agl_store.models import LLM
from agl_store.server import create_app
from agl_train.runner.proxy_control import LLM_RESOURCE_NAME
from tests.proxy.helpers import serve

from .rollouts import CALLS, llm_call_span, publish, write_rollout, write_two_steps


async def get(url: str, path: str, **params: Any) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        response = await http.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


async def test_each_step_summarises_train_and_validation_apart(store, store_url) -> None:
    await write_two_steps(store)

    page = await get(store_url, "/view/api/steps")

    assert page["total"] == 3  # resource sets
    newest, first = page["steps"]
    assert (newest["step"], newest["finished"], list(newest["modes"])) == ("2", False, ["train"])
    assert (newest["modes"]["train"]["running"], newest["modes"]["train"]["reward"]["n"]) == (1, 0)
    assert (first["step"], first["finished"], len(first["resources_ids"])) == ("1", True, 2)
    train, val = first["modes"]["train"], first["modes"]["val"]
    assert {k: train[k] for k in ("rollouts", "succeeded", "failed", "timeout", "running")} == {
        "rollouts": 5,
        "succeeded": 3,
        "failed": 1,
        "timeout": 1,
        "running": 0,
    }
    assert train["reward"]["mean"] == pytest.approx(0.5)
    assert train["reward"]["std"] == pytest.approx((1 / 6) ** 0.5)
    assert (train["reward"]["min"], train["reward"]["max"]) == (0.0, 1.0)
    assert (train["rows"], train["trained_tokens"]) == (3, 3 * 5)
    assert (val["succeeded"], val["reward"]["mean"], val["reward"]["std"], val["rows"]) == (
        2,
        pytest.approx(0.7),
        pytest.approx(0.2),
        2,
    )


async def test_a_live_step_is_read_again(store, store_url) -> None:
    await write_two_steps(store)
    assert (await get(store_url, "/view/api/steps"))["steps"][0]["modes"]["train"]["running"] == 1

    await write_rollout(store, CALLS, reward=0.5, version="2")  # under the latest set: step 2
    newest = (await get(store_url, "/view/api/steps"))["steps"][0]

    assert newest["modes"]["train"]["succeeded"] == 1 and newest["modes"]["train"]["reward"]["mean"] == 0.5


async def test_a_rollout_served_partly_by_newer_weights_stays_in_its_step(store, store_url) -> None:
    await publish(store)
    slow = await write_rollout(store, CALLS[:1], version="1", finish=False)
    await publish(store)  # the next step: the slow rollout's next calls are served by version 2
    for k in range(2):
        later = llm_call_span(slow.rollout_id, slow.attempt_id, [1, 2, 3, 4, 5 + k], [7], 0.0, version="2")
        await store.add_span(later)
    await store.update_attempt(slow.rollout_id, slow.attempt_id, status="succeeded")
    await write_rollout(store, CALLS, version="2")

    steps = (await get(store_url, "/view/api/steps"))["steps"]

    assert [(step["step"], step["modes"]["train"]["succeeded"]) for step in steps] == [("2", 1), ("1", 1)]


async def test_steps_are_paged_by_resource_set(store, store_url) -> None:
    await write_two_steps(store)

    oldest = await get(store_url, "/view/api/steps", limit=1, offset=2)

    assert (oldest["total"], [s["step"] for s in oldest["steps"]]) == (3, ["1"])
    assert oldest["steps"][0]["modes"]["train"]["rollouts"] == 5
    async with httpx.AsyncClient(base_url=store_url) as http:
        response = await http.get("/view/api/steps", params={"limit": "many"})
    assert response.status_code == 400 and "limit" in response.json()["error"]["message"]


async def test_the_span_lines_carry_the_api_and_the_token_id_status(store, store_url) -> None:
    extra = {"agl.api": "responses", "agl.token_ids.status": "mismatch", "agl.token_ids.cause": "retokenized"}
    known = await write_rollout(store, CALLS[:1], extra=extra)

    call = (await get(store_url, f"/view/api/rollouts/{known.rollout_id}"))["spans"][0]

    assert (call["api"], call["token_ids_status"], call["token_ids_cause"]) == ("responses", "mismatch", "retokenized")


async def test_tokens_are_decoded_with_the_published_model_when_it_is_readable(store, tiny_model_path) -> None:
    known = await write_rollout(store, CALLS)
    async with serve(create_app(store, manage_store=False)) as url:
        path = f"/view/api/rollouts/{known.rollout_id}/tokens"
        assert ((await get(url, path))["decoded"], (await get(url, path))["tokenizer"]) == (False, None)

        await publish(store, model="not-a-directory")  # a served name, and an endpoint that does not answer
        assert (await get(url, path))["decoded"] is False

        await publish(store, model=str(tiny_model_path))  # verl serves a model under its path by default
        view = await get(url, path)
        assert (view["decoded"], view["tokenizer"]) == (True, str(tiny_model_path))
        assert view["pieces"]


@pytest.mark.vllm
async def test_the_published_endpoint_names_the_model_directory(store, vllm_server, tiny_model_path) -> None:
    known = await write_rollout(store, CALLS)
    # vLLM answers `root` = the model's path on /v1/models, whatever name it serves it under.
    await store.add_resources({LLM_RESOURCE_NAME: LLM(endpoint=vllm_server.base_url, model=vllm_server.model)})
    async with serve(create_app(store, manage_store=False)) as url:
        view = await get(url, f"/view/api/rollouts/{known.rollout_id}/tokens")

    assert view["decoded"] is True and view["pieces"]
    assert view["tokenizer"] is not None and view["tokenizer"] != vllm_server.model


async def test_the_span_lines_show_the_attempt_s_call_graph(store, store_url) -> None:
    rollout = await store.start_rollout(input={"question": "weather"}, mode="train")
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
    first = llm_call_span(rid, aid, [1, 2, 3], [4, 5], 0.0)
    bridged = llm_call_span(rid, aid, [1, 2, 3, 4, 5, 6], [7], 1.0)
    branched = llm_call_span(rid, aid, [1, 9], [7], 2.0)
    first.attributes["agl.chain"] = {"prompt": "rendered", "parent": None, "choice": None, "cause": "first_call"}
    bridged.attributes["agl.chain"] = {"prompt": "bridged", "parent": first.span_id, "choice": 0, "cause": None}
    branched.attributes["agl.chain"] = {
        "prompt": "branched",
        "parent": first.span_id,
        "choice": None,
        "cause": "history_edited",
    }
    for span in (first, bridged, branched):
        await store.add_span(span)

    lines = (await get(store_url, f"/view/api/rollouts/{rid}"))["spans"]

    assert [(line["chain"]["prompt"], line["chain"]["cause"]) for line in lines] == [
        ("rendered", "first_call"),
        ("bridged", None),
        ("branched", "history_edited"),
    ]
    assert [line.get("chain_parent_sequence") for line in lines] == [None, 1, 1]
