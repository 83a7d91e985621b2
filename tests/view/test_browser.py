"""The view in a real headless browser: a store filled by a real proxy run, filters, live
refresh, the token view's colours, the bearer key, and agent output that must not execute."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agl_store.models import EnqueueRolloutRequest, reward_span
from agl_store.server import create_app
from tests.proxy.helpers import serve

from .browser import CHROMIUM, CHROMIUM_ARGS, missing_browser
from .rollouts import (
    CALLS,
    INJECTION,
    known_calls,
    known_limits,
    write_known_rollout,
    write_rollout,
    write_two_steps,
)

pytestmark = pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))

# The README's screenshot is rewritten only when asked (AGL_UPDATE_DOCS_IMAGES=1), so a test run leaves the tree clean.
README_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "token-view.png"
TRAINING_SCREENSHOT = README_SCREENSHOT.with_name("training-page.png")
UPDATE_DOCS_IMAGES = os.environ.get("AGL_UPDATE_DOCS_IMAGES") == "1"
ROLE_COLOURS = {  # app.css: --prompt, --generated, --inserted, --truncated, --dropped
    "prompt": "rgb(219, 228, 240)",
    "generated": "rgb(183, 228, 176)",
    "inserted": "rgb(247, 217, 166)",
    "truncated": "rgb(244, 182, 182)",
    "dropped": "rgb(213, 208, 220)",
}


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    """A fresh browser context (empty sessionStorage); a script error on the page fails the test."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    opened = await context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    await context.close()
    assert errors == []


def expect(locator: Any) -> Any:
    from playwright.async_api import expect as playwright_expect

    return playwright_expect(locator)


async def test_pages_render_a_store_filled_by_a_real_proxy_run(vllm_server, store, page) -> None:
    from agl_proxy.server.proxy import LLMProxy

    entry = {
        "model_name": "tiny",
        "litellm_params": {"model": f"hosted_vllm/{vllm_server.model}", "api_base": vllm_server.base_url},
    }
    # As `agl proxy serve` does: the store's routes, and so the view, on the proxy's port.
    proxy = LLMProxy(model_list=[entry], store=store, port=0, store_app=create_app(store, manage_store=False))
    await proxy.start()
    try:
        rollout = await store.start_rollout(input={"question": "weather in Paris"}, mode="train")
        rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
        messages: list[dict] = [{"role": "user", "content": "What is the weather in Paris?"}]
        async with httpx.AsyncClient(base_url=f"{proxy.url}/rollout/{rid}/attempt/{aid}/v1", timeout=120) as http:
            for turn in range(3):
                response = await http.post(
                    "/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 6}
                )
                assert response.status_code == 200, response.text
                messages += [
                    response.json()["choices"][0]["message"],
                    {"role": "user", "content": f"tool said: sunny ({turn})"},
                ]
        for _ in range(500):  # the proxy exports spans in the background
            if len(await store.query_spans(rid, name="agl.llm_call")) == 3:
                break
            await asyncio.sleep(0.02)
        await store.add_span(reward_span(rid, aid, 1.0))
        await store.update_attempt(rid, aid, status="succeeded")

        await page.goto(proxy.url + "/")
        row = page.locator(f"[data-testid=rollouts] tr[data-rollout-id='{rid}']")
        await expect(row).to_contain_text("succeeded")
        cells = row.locator("td")
        await expect(cells.nth(7)).to_have_text("3")  # LLM calls
        await expect(cells.nth(6)).to_have_text("1")  # reward

        await row.locator("a").first.click()
        spans = page.locator("[data-testid=spans] tr.span-row")
        await expect(spans).to_have_count(4)
        await expect(spans.nth(3)).to_contain_text("agl.reward")
        await expect(spans.nth(0)).to_contain_text(vllm_server.base_url.rstrip("/").rsplit("/v1", 1)[0])
        await spans.nth(0).click()
        await expect(page.locator("[data-testid=span-detail]")).to_contain_text("What is the weather in Paris?")

        await page.get_by_role("link", name="token view").click()
        await expect(page.locator("[data-testid=token-row]").first).to_be_visible()
        generated = await page.locator("[data-role=generated]").count()
        calls = await store.query_spans(rid, name="agl.llm_call")
        assert generated == sum(len(span.attributes["agl.choices"][0]["token_ids"]) for span in calls)
    finally:
        await proxy.stop()


async def test_filters_and_paging_work(store, store_url, page) -> None:
    await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i, mode="val") for i in range(3)])
    done = await write_rollout(store, CALLS, mode="train")
    await page.goto(store_url + "/")
    table_rows = page.locator("[data-testid=rollouts] tbody tr")
    await expect(table_rows).to_have_count(4)

    await page.get_by_label("succeeded").check()
    await expect(table_rows).to_have_count(1)
    await expect(table_rows.first).to_have_attribute("data-rollout-id", done.rollout_id)

    await page.get_by_label("succeeded").uncheck()
    await page.get_by_label("mode").select_option("val")
    await expect(table_rows).to_have_count(3)
    await expect(page.locator("[data-testid=page-range]")).to_have_text("1–3 of 3")

    await page.goto(f"{store_url}/#/?limit=2")
    await expect(page.locator("[data-testid=page-range]")).to_have_text("1–2 of 4")
    await page.get_by_role("link", name="older →").click()
    await expect(page.locator("[data-testid=page-range]")).to_have_text("3–4 of 4")

    await page.goto(f"{store_url}/#/?after={time.time() + 3600}")
    await expect(page.locator("[data-testid=page-range]")).to_have_text("0–0 of 0")


async def test_the_list_refreshes_while_a_run_is_going(store, store_url, page) -> None:
    await page.goto(store_url + "/")
    await expect(page.locator("[data-testid=page-range]")).to_have_text("0–0 of 0")

    rollout = await store.enqueue_rollout(input={"late": True})

    await expect(page.locator(f"tr[data-rollout-id='{rollout.rollout_id}']")).to_be_visible()


async def test_a_running_rollouts_spans_appear_as_they_are_recorded(store, store_url, page) -> None:
    running = await write_rollout(store, CALLS, reward=None, finish=False)
    await page.goto(f"{store_url}/#/rollouts/{running.rollout_id}")
    spans = page.locator("[data-testid=spans] tr.span-row")
    await expect(spans).to_have_count(2)

    await store.add_span(reward_span(running.rollout_id, running.attempt_id, 0.5))

    await expect(spans).to_have_count(3)
    await expect(spans.nth(2)).to_contain_text("agl.reward = 0.5")


async def test_the_token_view_colours_a_known_rollout(store, page, tiny_model_path, encode, tmp_path) -> None:
    known = await write_known_rollout(store, encode)
    limits = known_limits(known_calls(encode))
    view = {"view": {"tokenizer": str(tiny_model_path)}}  # what --page-setting view.tokenizer=DIR gives
    async with serve(create_app(store, manage_store=False, page_settings=view)) as url:
        query = f"max_prompt_length={limits.max_prompt_length}&max_response_length={limits.max_response_length}"
        await page.goto(f"{url}/#/rollouts/{known.rollout_id}/tokens?{query}")
        rows = page.locator("[data-testid=token-row]")
        await expect(rows).to_have_count(2)

        first, second = known.calls[0], known.calls[2]
        n_observation = len(known.calls[1]["prompt"]) - len(first["prompt"]) - len(first["response"])
        first_row = rows.nth(0)
        assert await first_row.locator("[data-role=prompt]").count() == len(first["prompt"])
        assert await first_row.locator("[data-role=inserted]").count() == n_observation
        assert await first_row.locator("[data-role=truncated]").count() == 4
        assert (
            await first_row.locator("[data-role=generated]").count()
            == len(first["response"]) + len(known.calls[1]["response"]) - 4
        )
        assert await rows.nth(1).locator("[data-role=dropped]").count() == len(second["prompt"]) + len(
            second["response"]
        )
        for role, colour in ROLE_COLOURS.items():
            token = page.locator(f"[data-testid=token-row] [data-role={role}]").first
            await expect(token).to_have_css("background-color", colour)

        await expect(first_row).to_contain_text("Let me call get_weather(Paris).")
        await expect(rows.nth(1).locator("[data-testid=prefix-break]")).to_contain_text("Prefix broke at call 2")
        await expect(rows.nth(1)).to_contain_text("dropped: prompt")
        await expect(first_row).to_contain_text("truncated to")
        await expect(page.locator("[data-testid=reward]")).to_have_text("0.75")
        screenshot = README_SCREENSHOT if UPDATE_DOCS_IMAGES else tmp_path / "token-view.png"
        await page.screenshot(path=str(screenshot), full_page=True)
        assert screenshot.stat().st_size > 0


async def test_the_token_view_shows_which_weights_sampled_each_token(store, store_url, page) -> None:
    # One answer that went on across a weight update: 5 tokens of version 3, then 7 of version 4.
    answer = list(range(10, 22))
    choice = {"index": 0, "token_ids": answer, "logprobs": None, "finish_reason": "stop"}
    crossing = {"agl.choices": [{**choice, "segments": [["3", 5], ["4", 7]]}]}
    known = await write_rollout(store, [{"prompt": [1, 2, 3], "response": answer}], version="3", extra=crossing)

    await page.goto(f"{store_url}/#/rollouts/{known.rollout_id}/tokens")

    row = page.locator("[data-testid=token-row]")
    await expect(row.locator("[data-version='3']")).to_have_count(5)
    await expect(row.locator("[data-version='4']")).to_have_count(7)
    await expect(row.locator("[data-testid=row-versions]")).to_have_text("sampled by v3 × 5 → v4 × 7")
    first_version, second_version = row.locator("[data-version='3']").first, row.locator("[data-version='4']").first
    await expect(first_version).to_have_class("tok role-generated ver-0")
    await expect(second_version).to_have_class("tok role-generated ver-1")


async def test_agent_output_is_shown_as_text_and_never_runs(store, page, tiny_model_path, encode) -> None:
    calls = [{"prompt": encode("<|im_start|>user\nhi<|im_end|>\n"), "response": encode(INJECTION)}]
    known = await write_rollout(store, calls, content=INJECTION, input={"question": INJECTION})
    view = {"view": {"tokenizer": str(tiny_model_path)}}  # what --page-setting view.tokenizer=DIR gives
    async with serve(create_app(store, manage_store=False, page_settings=view)) as url:
        await page.goto(f"{url}/#/rollouts/{known.rollout_id}")
        await expect(page.locator("[data-testid=input]")).to_contain_text(INJECTION.replace('"', '\\"'))
        await page.locator("[data-testid=spans] tr.span-row").first.click()
        await expect(page.locator("[data-testid=span-detail]")).to_contain_text("<script>window.__pwned=1</script>")

        await page.goto(f"{url}/#/rollouts/{known.rollout_id}/tokens")
        tokens = page.locator("[data-testid=token-row] .tokens")
        await expect(tokens).to_contain_text("<script>window.__pwned=1</script>")

        assert await page.evaluate("window.__pwned") is None
        assert await page.locator("main img, main script").count() == 0


async def test_the_page_asks_for_the_key_once(store, page) -> None:
    done = await write_rollout(store, CALLS)
    async with serve(create_app(store, key="s3cret", manage_store=False)) as url:
        await page.goto(url + "/")
        key = page.locator("#key-input")
        await expect(key).to_be_visible()
        await key.fill("wrong")
        await page.get_by_role("button", name="Use key").click()
        await expect(page.locator("#key-error")).to_have_text("That key was refused.")
        await key.fill("s3cret")
        await page.get_by_role("button", name="Use key").click()

        await expect(page.locator(f"tr[data-rollout-id='{done.rollout_id}']")).to_be_visible()
        await page.locator(f"tr[data-rollout-id='{done.rollout_id}'] a").first.click()
        await expect(page.locator("[data-testid=spans] tr.span-row")).to_have_count(3)
        await expect(page.locator("#key-form")).to_be_hidden()
        assert await page.evaluate("sessionStorage.getItem('agl.view.key')") == "s3cret"


async def test_the_training_page_shows_each_step_and_follows_a_live_one(store, store_url, page, tmp_path) -> None:
    await write_two_steps(store)
    await page.goto(store_url + "/")
    await page.get_by_role("link", name="Training").click()

    steps = page.locator("[data-testid=steps] tbody tr")
    await expect(steps).to_have_count(2)
    live, first = steps.nth(0), steps.nth(1)
    await expect(first.locator("td").first).to_have_text("1")
    await expect(first.locator("[data-testid=train-outcomes]")).to_have_text("3 ok · 1 failed · 1 timed out")
    await expect(first.locator("[data-testid=train-reward]")).to_have_text("0.5 ± 0.4082")
    await expect(first.locator("[data-testid=train-range]")).to_have_text("0 … 1")
    await expect(first.locator("[data-testid=train-rows]")).to_have_text("3")
    await expect(first.locator("[data-testid=train-tokens]")).to_have_text("15")
    await expect(first.locator("[data-testid=val-outcomes]")).to_have_text("2 ok")
    await expect(first.locator("[data-testid=val-reward]")).to_have_text("0.7 ± 0.2")
    await expect(live.locator("[data-testid=live-step]")).to_be_visible()
    await expect(live.locator("[data-testid=train-outcomes]")).to_have_text("1 running")
    chart = page.locator("[data-testid=reward-chart]")
    await expect(chart.locator("circle.train")).to_have_count(1)  # step 2 has no reward yet
    await expect(chart.locator("circle.val")).to_have_count(1)

    await write_rollout(store, CALLS, reward=0.9, version="2")

    await expect(live.locator("[data-testid=train-outcomes]")).to_have_text("1 ok · 1 running")
    await expect(live.locator("[data-testid=train-reward]")).to_have_text("0.9 ± 0")
    await expect(chart.locator("circle.train")).to_have_count(2)
    screenshot = TRAINING_SCREENSHOT if UPDATE_DOCS_IMAGES else tmp_path / "training-page.png"
    await page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 0


async def test_a_call_without_usable_token_ids_stands_out(store, store_url, page) -> None:
    mismatch = {"agl.api": "responses", "agl.token_ids.status": "mismatch", "agl.token_ids.cause": "retokenized"}
    known = await write_rollout(store, CALLS[:1], extra=mismatch)
    await page.goto(f"{store_url}/#/rollouts/{known.rollout_id}")

    call = page.locator("[data-testid=spans] tr.span-row").first
    await expect(call).to_contain_text("responses")
    badge = call.locator("[data-testid=token-ids-status]")
    await expect(badge).to_have_text("mismatch: retokenized")
    await expect(badge).to_have_css("background-color", "rgb(248, 199, 195)")
