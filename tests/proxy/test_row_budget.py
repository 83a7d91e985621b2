"""The row budget (`row_tokens`): a call generates at most what its trajectory row still holds.

The arithmetic on the token chain's links, the field's validation (a ValueError or a 400 naming it),
and a backend that renders itself, where every call counts as a row's first.
"""

from __future__ import annotations

from typing import Any

import pytest

from agl_proxy.chain.digests import request_keys
from agl_proxy.chain.links import Link
from agl_proxy.chain.memory import chain_entry, root_prompt_lengths
from agl_proxy.chain.row_budget import ROW_FULL, fit_row
from agl_proxy.common.errors import BadRequestError
from agl_proxy.controls.sampling import Enforcement, checked_by_mode
from agl_proxy.server.cli import settings_from_args
from agl_proxy.server.proxy import LLMProxy
from agl_store.cli import build_parser
from agl_store.models import Span, TraceStatus

from .conftest import chat_body
from .helpers import wait_for_spans

QUESTION = {"role": "user", "content": "Fix the failing test."}
ANSWER = {"role": "assistant", "content": "Running it."}


def _entry(span_id: str, prompt: int, root: int | None = None) -> Any:
    keys = request_keys({"messages": [QUESTION]})
    return chain_entry(span_id, keys, list(range(prompt)), [([7, 8, 9], ANSWER)], root)


def test_a_call_that_starts_a_row_may_fill_it() -> None:
    row = fit_row(Link("rendered", cause="first_call"), prompt_len=500, row_tokens=1000)
    assert (row.root_prompt_len, row.used, row.cap(4096), row.cap(256)) == (500, 0, 1000, 256)
    # A branched call (rendered whole) starts a row too, whatever its parent's row held.
    parent = _entry("a", prompt=900, root=100)
    assert fit_row(Link("branched", parent=parent, cause="history_edited"), 1200, 1000).cap(4096) == 1000


def test_a_bridged_call_gets_what_its_row_has_left() -> None:
    root = _entry("a", prompt=500)
    assert root.root_prompt_len == 500  # an entry starts its own row unless told otherwise
    second = _entry("b", prompt=700, root=root.root_prompt_len)
    # The third call's prompt: the root's 500, then 300 tokens of answers and tool output.
    row = fit_row(Link("bridged", parent=second, choice=0), prompt_len=800, row_tokens=1000)
    assert (row.link.kind, row.root_prompt_len, row.used) == ("bridged", 500, 300)
    assert (row.cap(4096), row.cap(100)) == (700, 100)
    render: dict[str, Any] = {"request_id": "r", "sampling_params": {"max_tokens": 4096, "temperature": 1.0}}
    capped = row.capped_render(render)
    assert capped == {"request_id": "r", "sampling_params": {"max_tokens": 700, "temperature": 1.0}}
    assert render["sampling_params"]["max_tokens"] == 4096  # the render's answer is left as it was
    assert row.attributes(capped) == {"max_tokens": 700, "row_tokens": 1000, "row_used": 300}
    # A retry replaces its parent: the same prompt, the same row.
    assert fit_row(Link("retry", parent=second), prompt_len=700, row_tokens=1000).cap(4096) == 800


def test_a_call_whose_row_is_full_starts_a_new_row_with_its_prompt_kept() -> None:
    parent = _entry("b", prompt=1400, root=500)
    row = fit_row(Link("bridged", parent=parent, choice=0), prompt_len=1500, row_tokens=1000)
    assert row.link.attribute() == {"prompt": "branched", "parent": "b", "choice": None, "cause": ROW_FULL}
    assert (row.root_prompt_len, row.used, row.cap(4096)) == (1500, 0, 1000)
    # Exactly full is full: the call would have nothing to generate.
    assert fit_row(Link("bridged", parent=parent, choice=0), 1500, 1000 + 0).link.cause == ROW_FULL
    assert fit_row(Link("bridged", parent=parent, choice=0), 1499, 1000).cap(4096) == 1


def test_without_a_budget_the_row_is_still_followed_and_nothing_is_capped() -> None:
    parent = _entry("b", prompt=1400, root=500)
    row = fit_row(Link("bridged", parent=parent, choice=0), prompt_len=1500, row_tokens=None)
    assert (row.link.kind, row.root_prompt_len, row.used, row.cap(4096)) == ("bridged", 500, 1000, 4096)
    render: dict[str, Any] = {"sampling_params": {"max_tokens": None}}  # vLLM's default, left to the engine
    assert row.capped_render(render) is render and row.attributes(render) is None


def _span(span_id: str, prompt: int, chain: dict[str, Any] | None) -> Span:
    attributes: dict[str, Any] = {"agl.prompt_token_ids": list(range(prompt))}
    if chain is not None:
        attributes["agl.chain"] = chain
    return Span(
        span_id=span_id,
        rollout_id="ro",
        attempt_id="at",
        sequence_id=1,
        name="agl.llm_call",
        start_time=0.0,
        end_time=1.0,
        status=TraceStatus(status_code="OK"),
        attributes=attributes,
    )


def test_read_from_the_store_each_call_s_row_start_follows_the_chain() -> None:
    spans = [
        _span("a", 10, {"prompt": "rendered", "parent": None, "choice": None, "cause": "first_call"}),
        _span("b", 20, {"prompt": "bridged", "parent": "a", "choice": 0, "cause": None}),
        _span("c", 20, {"prompt": "retry", "parent": "b", "choice": None, "cause": None}),
        _span("d", 40, {"prompt": "branched", "parent": "c", "choice": None, "cause": ROW_FULL}),
        _span("e", 50, {"prompt": "bridged", "parent": "d", "choice": 0, "cause": None}),
        _span("f", 60, {"prompt": "bridged", "parent": "gone", "choice": 0, "cause": None}),
        _span("g", 70, None),
    ]
    # A parent the page does not hold, or no chain at all: the call counts as a row's first.
    assert root_prompt_lengths(spans) == {"a": 10, "b": 10, "c": 10, "d": 40, "e": 40, "f": 60, "g": 70}


def test_the_budget_caps_every_call_as_a_row_s_first_and_is_never_sent_or_refused() -> None:
    refuse = Enforcement("train", {"max_tokens": 4096, "row_tokens": 1000, "temperature": 1.0}, "refuse")
    assert refuse.row_tokens == 1000
    assert refuse.apply({"max_tokens": 2000, "temperature": 1.0}) == {"max_tokens": 1000, "temperature": 1.0}
    assert refuse.apply({}) == {"max_tokens": 1000, "temperature": 1.0}
    assert refuse.apply({"max_completion_tokens": 300}) == {"max_completion_tokens": 300, "temperature": 1.0}
    # The per-call cap is still the agent's business under `refuse`; the row is not.
    with pytest.raises(BadRequestError, match="max_tokens at most 4096"):
        refuse.apply({"max_tokens": 5000})
    assert Enforcement("train", {"temperature": 1.0}, "override").row_tokens is None


@pytest.mark.parametrize(("value", "message"), [(0, ">= 1"), (-5, ">= 1"), (100.5, "an integer"), ("big", "number")])
def test_a_bad_budget_is_a_value_error_naming_the_field(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=rf"by_mode\.train\.row_tokens must be .*{message}"):
        checked_by_mode({"train": {"row_tokens": value}})
    assert checked_by_mode({"train": {"row_tokens": 8192.0}}) == {"train": {"row_tokens": 8192}}


def test_the_command_line_sets_the_budget_by_mode() -> None:
    def settings(*flags: str) -> Any:
        return settings_from_args(build_parser().parse_args(["proxy", "serve", "--backend", "x", *flags]))

    assert settings("--sampling", "train.row_tokens=8192").sampling_by_mode == {"train": {"row_tokens": 8192}}
    with pytest.raises(ValueError, match=r"--sampling\.train\.row_tokens must be >= 1, got 0"):
        settings("--sampling", "train.row_tokens=0")


async def test_post_sampling_refuses_a_bad_budget_with_400_naming_it(proxy: LLMProxy, http) -> None:
    answer = await http.post(proxy.url + "/proxy/sampling", json={"by_mode": {"train": {"row_tokens": 0}}})
    assert answer.status_code == 400 and "by_mode.train.row_tokens must be >= 1" in answer.json()["error"]["message"]
    table = {"train": {"max_tokens": 2048, "row_tokens": 8192}}
    answer = await http.post(proxy.url + "/proxy/sampling", json={"by_mode": table})
    assert answer.status_code == 200 and answer.json()["by_mode"] == table


async def test_a_backend_that_renders_itself_gets_each_call_capped_as_a_row_s_first(
    proxy: LLMProxy, backend, store, http
) -> None:
    fake, _ = backend
    by_mode = {"train": {"max_tokens": 2048, "row_tokens": 100}}
    assert (await http.post(proxy.url + "/proxy/sampling", json={"by_mode": by_mode})).status_code == 200
    rollout = await store.inner.start_rollout(input={}, mode="train")
    url = proxy.as_resource().get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)

    await http.post(url + "/chat/completions", json=chat_body(max_tokens=1000))
    sent = fake.requests[-1]
    assert sent["max_tokens"] == 100 and "row_tokens" not in sent
    [span] = await wait_for_spans(store, rollout.rollout_id, 1)
    assert span.attributes["agl.sampling"] == {"max_tokens": 100, "row_tokens": 100}
