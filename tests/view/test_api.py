"""The view's JSON API on a real store server: paging and filters, one rollout, one span, the key."""

from __future__ import annotations

import time

import httpx
import pytest

from agl_store.models import EnqueueRolloutRequest
from agl_store.server import create_app
from tests.proxy.helpers import serve

from .rollouts import CALLS, write_rollout


async def get(url: str, path: str, **params) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        response = await http.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


async def test_the_list_summarises_each_rollout(store, store_url) -> None:
    done = await write_rollout(store, CALLS, reward=0.5)
    await store.enqueue_rollout(input={"q": "waiting"}, mode="val")

    page = await get(store_url, "/view/api/rollouts")

    assert (page["total"], page["offset"]) == (2, 0)
    queued, finished = page["items"]  # newest first
    assert (queued["status"], queued["mode"], queued["attempts"], queued["n_calls"], queued["reward"]) == (
        "queuing",
        "val",
        0,
        0,
        None,
    )
    assert finished["rollout_id"] == done.rollout_id
    assert (finished["status"], finished["attempts"], finished["reward"], finished["n_calls"]) == (
        "succeeded",
        1,
        0.5,
        2,
    )
    assert (finished["tokens_in"], finished["tokens_out"]) == (9, 5)
    assert finished["duration"] >= 0


async def test_filters_and_pages_are_applied_by_the_store(store, store_url) -> None:
    await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i, mode="train") for i in range(7)])
    await write_rollout(store, CALLS, mode="val")
    middle = time.time()
    await write_rollout(store, CALLS, mode="val", finish=False)

    assert (await get(store_url, "/view/api/rollouts", status="queuing", limit=3))["total"] == 7
    second_page = await get(store_url, "/view/api/rollouts", status="queuing", limit=3, offset=3)
    assert [item["status"] for item in second_page["items"]] == ["queuing"] * 3
    assert (await get(store_url, "/view/api/rollouts", status="succeeded,running"))["total"] == 2
    assert (await get(store_url, "/view/api/rollouts", mode="val"))["total"] == 2
    after = await get(store_url, "/view/api/rollouts", after=middle)
    assert [item["status"] for item in after["items"]] == ["running"]
    assert (await get(store_url, "/view/api/rollouts", before=middle))["total"] == 8


async def test_bad_filters_are_named(store_url) -> None:
    async with httpx.AsyncClient(base_url=store_url) as http:
        response = await http.get("/view/api/rollouts", params={"status": "done"})
        assert response.status_code == 400 and "status" in response.json()["error"]["message"]
        response = await http.get("/view/api/rollouts", params={"after": "yesterday"})
        assert response.status_code == 400 and "after" in response.json()["error"]["message"]
        response = await http.get("/view/api/rollouts/ro-missing")
        assert response.status_code == 404


async def test_one_rollout_lists_attempts_and_spans_in_sequence_order(store, store_url) -> None:
    known = await write_rollout(store, CALLS, reward=1.0)

    detail = await get(store_url, f"/view/api/rollouts/{known.rollout_id}")

    assert [a["attempt_id"] for a in detail["attempts"]] == [known.attempt_id]
    assert [(s["sequence_id"], s["name"]) for s in detail["spans"]] == [
        (1, "agl.llm_call"),
        (2, "agl.llm_call"),
        (3, "agl.reward"),
    ]
    call = detail["spans"][1]
    assert (call["tokens_in"], call["tokens_out"], call["backend"], call["status"]) == (
        6,
        3,
        "http://127.0.0.1:9/v1",
        "OK",
    )
    assert call["duration"] == pytest.approx(0.25)
    span = await get(store_url, f"/view/api/rollouts/{known.rollout_id}/spans/{call['span_id']}")
    assert span["attributes"]["agl.prompt_token_ids"] == [1, 2, 3, 4, 5, 6]


async def test_token_view_takes_level_and_limits_from_the_query(store, store_url) -> None:
    known = await write_rollout(store, CALLS)
    path = f"/view/api/rollouts/{known.rollout_id}/tokens"

    assert [row["roles"] for row in (await get(store_url, path))["rows"]] == ["pppggiggg"]
    transition = await get(store_url, path, level="transition", max_response_length=2)
    assert [row["roles"] for row in transition["rows"]] == ["pppgg", "ppppppggt"]
    async with httpx.AsyncClient(base_url=store_url) as http:
        assert (await http.get(path, params={"level": "episode"})).status_code == 400
        assert (await http.get(path, params={"max_prompt_length": "0"})).status_code == 400


async def test_behind_a_key_the_page_is_open_and_the_data_is_not(store) -> None:
    async with serve(create_app(store, key="s3cret", manage_store=False)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            page = await http.get("/")
            assert page.status_code == 200 and "/view/app.js" in page.text
            assert "script-src 'self'" in page.headers["content-security-policy"]
            assert (await http.get("/view/app.js")).status_code == 200
            assert (await http.get("/view/api/rollouts")).status_code == 401
            keyed = await http.get("/view/api/rollouts", headers={"Authorization": "Bearer s3cret"})
            assert keyed.status_code == 200 and keyed.json()["total"] == 0


@pytest.mark.slow
async def test_a_page_of_a_hundred_thousand_rollouts(store, store_url) -> None:
    started = time.perf_counter()
    for batch in range(20):
        await store.enqueue_many_rollouts([EnqueueRolloutRequest(input={"i": batch * 5000 + i}) for i in range(5000)])
    filled = time.perf_counter()

    first = await get(store_url, "/view/api/rollouts", limit=50)
    answered = time.perf_counter()
    last = await get(store_url, "/view/api/rollouts", status="queuing", limit=50, offset=99_950)

    print(f"filled 100k rollouts in {filled - started:.1f}s; first page in {answered - filled:.3f}s")
    assert (first["total"], len(first["items"])) == (100_000, 50)
    assert (last["total"], len(last["items"]), last["items"][-1]["status"]) == (100_000, 50, "queuing")


async def test_the_store_server_lists_the_page_shell_as_open_and_can_leave_the_pages_out(store) -> None:
    with_pages = create_app(store, key="s3cret", manage_store=False)
    without = create_app(store, manage_store=False, pages=False)

    assert {"/", "/view/app.js", "/view/app.css"} <= with_pages.state.open_paths
    async with serve(without) as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/")).status_code == 404
        assert (await http.get("/view/api/rollouts")).status_code == 404


async def test_the_page_learns_the_call_span_attribute_names_from_the_server(store_url) -> None:
    config = await get(store_url, "/view/api/config")

    assert config["call_span"] == {"request": "agl.request", "response": "agl.response", "error": "agl.error"}


async def test_the_embedded_view_takes_its_settings_as_arguments(store) -> None:
    settings = {"view": {"level": "transition", "max_prompt_length": "100", "max_response_length": "50"}}
    async with serve(create_app(store, manage_store=False, page_settings=settings)) as url:
        config = await get(url, "/view/api/config")
    assert (config["level"], config["limits"], config["tokenizer"]) == (
        "transition",
        {"max_prompt_length": 100, "max_response_length": 50},
        False,
    )


def test_settings_the_view_cannot_use_are_refused_by_name(store) -> None:
    with pytest.raises(ValueError, match=r"unknown view setting\(s\) \['colour'\]"):
        create_app(store, manage_store=False, page_settings={"view": {"colour": "red"}})
    with pytest.raises(ValueError, match=r"view.level 'episode'"):
        create_app(store, manage_store=False, page_settings={"view": {"level": "episode"}})
    with pytest.raises(ValueError, match=r"page settings for \['viewer'\]"):
        create_app(store, manage_store=False, page_settings={"viewer": {"level": "transition"}})
