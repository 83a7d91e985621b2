"""Sampling enforced by the rollout's mode, set at run time through `/proxy/sampling`, and
recorded on every span (`agl.sampling`, `agl.sampling.mode`)."""

from __future__ import annotations

import pytest

from agl_proxy.server.cli import settings_from_args
from agl_proxy.server.proxy import LLMProxy
from agl_store.cli import build_parser

from .conftest import chat_body
from .helpers import model_entry, wait_for_spans

TRAIN_AND_VAL = {
    "train": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 256},
    "val": {"temperature": 0.0, "max_tokens": 64},
}


async def _rollout_url(store, proxy: LLMProxy, mode: str) -> tuple[str, str]:
    rollout = await store.inner.start_rollout(input={}, mode=mode)
    return rollout.rollout_id, proxy.as_resource().get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)


async def test_sampling_set_at_run_time_overrides_the_agent_by_mode(proxy: LLMProxy, backend, store, http) -> None:
    fake, _ = backend
    answer = await http.post(proxy.url + "/proxy/sampling", json={"by_mode": TRAIN_AND_VAL})
    assert answer.status_code == 200 and answer.json() == {"by_mode": TRAIN_AND_VAL, "on_conflict": "override"}

    train_id, train = await _rollout_url(store, proxy, "train")
    await http.post(train + "/chat/completions", json=chat_body(temperature=0.2, max_tokens=1000))
    assert {k: fake.requests[-1].get(k) for k in ("temperature", "top_p", "top_k", "max_tokens")} == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 256,  # the cap
    }
    await http.post(train + "/chat/completions", json=chat_body(max_completion_tokens=10))
    assert fake.requests[-1]["max_completion_tokens"] == 10 and "max_tokens" not in fake.requests[-1]

    val_id, val = await _rollout_url(store, proxy, "val")
    await http.post(val + "/chat/completions", json=chat_body(temperature=0.7, top_p=0.9))
    assert fake.requests[-1]["temperature"] == 0.0 and fake.requests[-1]["max_tokens"] == 64
    assert fake.requests[-1]["top_p"] == 0.9  # the val mode imposes no top_p

    test_id, test = await _rollout_url(store, proxy, "test")
    await http.post(test + "/chat/completions", json=chat_body(temperature=0.7))
    assert fake.requests[-1]["temperature"] == 0.7 and "max_tokens" not in fake.requests[-1]

    first, second = await wait_for_spans(store, train_id, 2)
    assert first.attributes["agl.sampling.mode"] == "train"
    assert first.attributes["agl.sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 256}
    assert second.attributes["agl.sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 10}
    [val_span] = await wait_for_spans(store, val_id, 1)
    assert val_span.attributes["agl.sampling"] == {"temperature": 0.0, "top_p": 0.9, "max_tokens": 64}
    [test_span] = await wait_for_spans(store, test_id, 1)
    assert test_span.attributes["agl.sampling"] == {"temperature": 0.7}
    assert "agl.sampling.mode" not in test_span.attributes  # nothing enforced for test rollouts


async def test_refuse_answers_400_to_a_conflicting_explicit_value(proxy: LLMProxy, backend, store, http) -> None:
    fake, _ = backend
    body = {"by_mode": {"val": {"temperature": 0.0, "max_tokens": 64}}, "on_conflict": "refuse"}
    assert (await http.post(proxy.url + "/proxy/sampling", json=body)).status_code == 200
    val_id, val = await _rollout_url(store, proxy, "val")

    hot = await http.post(val + "/chat/completions", json=chat_body(temperature=0.7))
    assert hot.status_code == 400
    assert "temperature=0.7 conflicts with the proxy's sampling for 'val' rollouts" in hot.json()["error"]["message"]
    long = await http.post(val + "/chat/completions", json=chat_body(max_tokens=100))
    assert long.status_code == 400 and "max_tokens at most 64" in long.json()["error"]["message"]
    assert fake.requests == []

    agreeing = await http.post(val + "/chat/completions", json=chat_body(temperature=0, max_tokens=10))
    assert agreeing.status_code == 200 and fake.requests[-1]["max_tokens"] == 10
    silent = await http.post(val + "/chat/completions", json=chat_body())
    assert silent.status_code == 200 and fake.requests[-1]["temperature"] == 0.0
    spans = await wait_for_spans(store, val_id, 4)
    assert [s.status.status_code for s in spans] == ["ERROR", "ERROR", "OK", "OK"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"by_mode": {"train": {"seed": 1}}}, "by_mode.train.seed"),
        ({"by_mode": {"train": {"temperature": "hot"}}}, "by_mode.train.temperature"),
        ({"by_mode": {"train": {"max_tokens": 0}}}, "by_mode.train.max_tokens"),
        ({"by_mode": {"train": {"top_k": 1.5}}}, "by_mode.train.top_k"),
        ({"by_mode": ["train"]}, "by_mode"),
        ({"by_mode": {}, "on_conflict": "ignore"}, "on_conflict"),
        ({"by_mode": {}, "mode": "train"}, "'mode'"),
    ],
)
async def test_a_bad_sampling_body_is_400_naming_the_field_and_changes_nothing(
    proxy: LLMProxy, http, body: dict, field: str
) -> None:
    before = {"by_mode": {"val": {"temperature": 0.0}}, "on_conflict": "override"}
    await http.post(proxy.url + "/proxy/sampling", json=before)
    answer = await http.post(proxy.url + "/proxy/sampling", json=body)
    assert answer.status_code == 400 and field in answer.json()["error"]["message"]
    assert (await http.get(proxy.url + "/proxy/sampling")).json() == before


async def test_settings_from_the_command_line(proxy_factory, backend, store, http) -> None:
    args = build_parser().parse_args(
        ["proxy", "serve", "--backend", backend[1], "--model", "tiny"]
        + ["--sampling", "train.temperature=1", "--sampling", "val.temperature=0", "--sampling", "all.max_tokens=32"]
        + ["--sampling-conflict", "refuse", "--require-token-ids", "--hold", "30"]
    )
    settings = settings_from_args(args)
    assert settings.require_token_ids and settings.hold_s == 30
    assert settings.sampling_by_mode == {
        "train": {"temperature": 1.0},
        "val": {"temperature": 0.0},
        "all": {"max_tokens": 32},
    }
    proxy = await proxy_factory([model_entry("tiny", backend[1])], settings=settings)
    assert (await http.get(proxy.url + "/proxy/sampling")).json()["on_conflict"] == "refuse"
    _, train = await _rollout_url(store, proxy, "train")
    assert (await http.post(train + "/chat/completions", json=chat_body(temperature=0.5))).status_code == 400
    # `all` is every call: a rollout's of any mode, and one on the plain URL, of no rollout.
    assert (await http.post(train + "/chat/completions", json=chat_body(temperature=1.0))).status_code == 200
    assert (await http.post(proxy.base_url + "/chat/completions", json=chat_body())).status_code == 200
    assert [sent["max_tokens"] for sent in backend[0].requests[-2:]] == [32, 32]

    for bad in ("train.temperature", "prod.temperature=1", "train.seed=1", "train.temperature=hot"):
        with pytest.raises(ValueError, match="--sampling"):
            settings_from_args(build_parser().parse_args(["proxy", "serve", "--backend", "x", "--sampling", bad]))


def test_settings_name_a_bad_value() -> None:
    with pytest.raises(ValueError, match="hold_s must be a finite number >= 0"):
        LLMProxy(hold_s=-1)
    with pytest.raises(ValueError, match="sampling_by_mode.train.seed"):
        LLMProxy(sampling_by_mode={"train": {"seed": 1}})
    with pytest.raises(TypeError, match="hold"):
        LLMProxy(hold=1)
