"""The model names coding agents send by default (`claude-sonnet-4-5`, `gpt-5.1-codex`, a small fast
background model) reach the served model through aliases and LiteLLM's wildcards."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agl_proxy.common.deployments import ModelRegistry
from agl_proxy.server.cli import model_list_from_args
from agl_store.cli import build_parser

from .helpers import model_entry, wait_for_spans


def serve_args(*extra: str) -> list[str]:
    return ["proxy", "serve", *extra]


async def test_an_alias_on_the_command_line_serves_an_agents_model_names(
    proxy_factory, backend, http, new_rollout, store
) -> None:
    args = build_parser().parse_args(
        serve_args("--backend", backend[1], "--model", "tiny", "--alias", "claude-*=tiny", "--alias", "gpt-5=tiny")
    )
    proxy = await proxy_factory(model_list_from_args(args))
    rollout_id, attempt_id = await new_rollout()
    headers = {"x-rollout-id": rollout_id, "x-attempt-id": attempt_id}
    question = [{"role": "user", "content": "hi"}]
    for model in ("claude-sonnet-4-5-20250929", "claude-haiku-4-5", "gpt-5"):
        body = {"model": model, "max_tokens": 4, "messages": question}
        assert (await http.post(proxy.base_url + "/messages", json=body, headers=headers)).status_code == 200
    nameless = await http.post(proxy.base_url + "/chat/completions", json={"messages": question})
    assert nameless.status_code == 200  # one model, under its name and aliases: a missing name means it
    unknown = await http.post(proxy.base_url + "/chat/completions", json={"model": "gpt-4o", "messages": question})
    assert unknown.status_code == 404 and "gpt-4o" in unknown.json()["error"]["message"]

    assert [sent["model"] for sent in backend[0].requests] == ["tiny"] * 4  # the name vLLM serves
    spans = await wait_for_spans(store, rollout_id, 3)
    assert [(s.attributes["gen_ai.request.model"], s.attributes["gen_ai.response.model"]) for s in spans] == [
        ("claude-sonnet-4-5-20250929", "tiny"),
        ("claude-haiku-4-5", "tiny"),
        ("gpt-5", "tiny"),
    ]


def test_config_aliases_and_wildcards_as_litellm_spells_them(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    entries = [model_entry("qwen", "http://127.0.0.1:1/v1"), model_entry("*", "http://127.0.0.1:2/v1")]
    settings = {"model_group_alias": {"gpt-5.1-codex": "qwen", "claude-*": {"model": "qwen", "hidden": True}}}
    config.write_text(yaml.safe_dump({"model_list": entries, "router_settings": settings}))
    registry = ModelRegistry(model_list_from_args(build_parser().parse_args(serve_args("--config", str(config)))))

    def served_at(name: str) -> str | None:
        return registry.resolve(name)[0].api_base

    assert served_at("gpt-5.1-codex") == served_at("claude-opus-4") == served_at("qwen") == "http://127.0.0.1:1/v1"
    assert served_at("anything-else") == "http://127.0.0.1:2/v1"  # `*` catches the rest


@pytest.mark.parametrize(
    ("alias", "message"),
    [("claude-*", "is not NAME=MODEL"), ("claude-*=nope", "'nope', which is not served")],
)
def test_a_bad_alias_names_itself(backend, alias: str, message: str) -> None:
    args = build_parser().parse_args(serve_args("--backend", "http://127.0.0.1:1", "--model", "tiny", "--alias", alias))
    with pytest.raises(ValueError, match=message):
        model_list_from_args(args)
