"""The codex-words example's reward and model copy (examples/codex_words), without running Codex:
its training run takes far longer than CI allows (examples/codex_words/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

from examples.codex_words.agent import codex_config, message_reward, token_texts
from examples.codex_words.train import CONTEXT, long_context_copy, overrides


def test_the_reward_is_the_share_of_the_final_messages_tokens_that_are_lowercase_words(tiny_model_path: Path) -> None:
    tokenizer = tiny_model_path / "tokenizer.json"
    message = "the agent calls X{ ;"
    tokens = token_texts(message, tokenizer)
    assert "".join(tokens) == message
    assert tokens[:2] == ["the", " agent"]
    lowercase = [token for token in tokens if token.strip().isalpha() and token.strip().islower()]
    assert message_reward(message, tokenizer) == len(lowercase) / len(tokens)
    assert message_reward("the agent", tokenizer) == 1.0
    assert message_reward("", tokenizer) == 0.0  # a Codex that wrote nothing


def test_codex_is_pointed_at_the_rollouts_base_url_over_the_responses_api() -> None:
    config = codex_config("http://127.0.0.1:9/rollout/r/attempt/a/v1")
    assert 'base_url = "http://127.0.0.1:9/rollout/r/attempt/a/v1"' in config
    assert 'wire_api = "responses"' in config and 'model_provider = "agl"' in config


def test_the_model_copy_allows_codexs_long_prompts_and_leaves_the_cache_as_built(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    copy = long_context_copy(tiny_model_path, tmp_path / "model")
    assert json.loads((copy / "config.json").read_text())["max_position_embeddings"] == CONTEXT
    assert json.loads((tiny_model_path / "config.json").read_text())["max_position_embeddings"] == 2048


def test_the_row_limits_hold_codexs_first_prompt(tmp_path: Path) -> None:
    settings = dict(o.lstrip("+").split("=", 1) for o in overrides(tmp_path, "http://127.0.0.1:9", 8, tmp_path))
    fixture = Path(__file__).parents[1] / "proxy" / "fixtures" / "codex_0.169.0_first_request.json"
    assert fixture.exists()
    # 23,982 tokens with the tiny vocabulary (docs/trainer.md, "Coding agents"), plus the task.
    assert int(settings["agentlightning.trace_aggregator.trajectory_max_prompt_length"]) > 23_982
    assert int(settings["data.max_prompt_length"]) > 23_982
    assert settings["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "1"
