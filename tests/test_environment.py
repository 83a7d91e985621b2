"""The test environment itself: the tiny vLLM returns exact token ids that agree with the tokenizer.

These are the facts the proxy and the trainer build on (see docs/vllm-wire.md): if one breaks after an
upgrade of vLLM or transformers, the failure shows up here first, with a plain message.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from examples.tiny_vllm.tiny_model import IM_END, TOOL_CALL_TOKENS, build, is_built
from examples.tiny_vllm.vllm_server import VLLMServer, build_tiny_model
from tests.support.conversations import TOOL_RESULT, messages, tool_history, tools


def post(server: VLLMServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{server.base_url}{path}", json={"model": server.model, **body}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def stream(server: VLLMServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST with ``stream: true`` and return the decoded SSE chunks (without the final ``[DONE]``)."""
    chunks = []
    payload = {"model": server.model, **body, "stream": True}
    with httpx.stream("POST", f"{server.base_url}{path}", json=payload, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks


def chat_template_ids(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False, **kwargs))


@pytest.mark.slow  # builds the model a second time, in a subprocess
def test_the_tiny_model_build_is_cached_and_reproducible(tiny_model_path, tmp_path) -> None:
    assert is_built(tiny_model_path)
    assert build(tiny_model_path) == tiny_model_path  # a second build is a no-op
    rebuilt = build_tiny_model(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (rebuilt / name).read_bytes() == (tiny_model_path / name).read_bytes(), name


def test_the_tokenizer_has_qwen2_special_tokens_and_a_tool_template(tokenizer) -> None:
    assert tokenizer.eos_token == IM_END
    for token in (*TOOL_CALL_TOKENS, "<|im_start|>", IM_END, "<|endoftext|>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, f"{token} is not one token"
    rendered = tokenizer.apply_chat_template(tool_history(), tools=tools(), add_generation_prompt=True, tokenize=False)
    assert '"name": "get_weather"' in rendered  # the tool signature
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert f"<tool_response>\n{TOOL_RESULT}\n</tool_response>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")


@pytest.mark.vllm
def test_chat_returns_token_ids_that_match_the_chat_template_and_the_text(vllm_server, tokenizer) -> None:
    body = post(vllm_server, "/chat/completions", {"messages": messages(), "max_tokens": 8, "return_token_ids": True})

    assert body["prompt_token_ids"] == chat_template_ids(tokenizer, messages())
    choice = body["choices"][0]
    assert len(choice["token_ids"]) == body["usage"]["completion_tokens"] > 0
    assert tokenizer.decode(choice["token_ids"], skip_special_tokens=True) == choice["message"]["content"]


@pytest.mark.vllm
def test_chat_with_tools_and_tool_results_in_the_history(vllm_server, tokenizer) -> None:
    request = {"messages": tool_history(), "tools": tools(), "tool_choice": "auto", "max_tokens": 4}
    body = post(vllm_server, "/chat/completions", {**request, "return_token_ids": True})

    assert body["prompt_token_ids"] == chat_template_ids(tokenizer, tool_history(), tools=tools())
    assert body["choices"][0]["token_ids"]


@pytest.mark.vllm
def test_completions_with_a_text_prompt_and_with_a_token_id_prompt(vllm_server, tokenizer) -> None:
    prompt = "The weather in Paris is"
    greedy = {"max_tokens": 6, "temperature": 0, "return_token_ids": True}
    by_text = post(vllm_server, "/completions", {"prompt": prompt, **greedy})
    choice = by_text["choices"][0]
    assert choice["prompt_token_ids"] == tokenizer(prompt)["input_ids"]
    assert tokenizer.decode(choice["token_ids"], skip_special_tokens=True) == choice["text"]

    ids = choice["prompt_token_ids"]
    by_ids = post(vllm_server, "/completions", {"prompt": ids, **greedy})
    assert by_ids["choices"][0]["prompt_token_ids"] == ids
    assert by_ids["choices"][0]["token_ids"] == choice["token_ids"]  # greedy: same prompt ids, same output


@pytest.mark.vllm
def test_streamed_chat_ids_equal_the_non_streamed_ids_at_temperature_zero(vllm_server) -> None:
    request = {"messages": messages(), "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    whole = post(vllm_server, "/chat/completions", request)
    chunks = stream(vllm_server, "/chat/completions", {**request, "stream_options": {"include_usage": True}})

    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    streamed_ids = [i for c in chunks for choice in c["choices"] for i in choice.get("token_ids") or []]
    assert streamed_ids == whole["choices"][0]["token_ids"]
    streamed_text = "".join(choice["delta"].get("content") or "" for c in chunks for choice in c["choices"])
    assert streamed_text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": whole["usage"]["prompt_tokens"],
        "completion_tokens": whole["usage"]["completion_tokens"],
        "total_tokens": whole["usage"]["total_tokens"],
    }


@pytest.mark.vllm
def test_streamed_completion_ids_equal_the_non_streamed_ids_at_temperature_zero(vllm_server) -> None:
    request = {"prompt": "Tell me a number", "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    whole = post(vllm_server, "/completions", request)["choices"][0]
    chunks = stream(vllm_server, "/completions", request)

    assert chunks[0]["choices"][0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert [i for c in chunks for i in c["choices"][0]["token_ids"]] == whole["token_ids"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]


@pytest.mark.vllm
def test_chat_logprobs_align_with_token_ids(vllm_server) -> None:
    request = {"messages": messages(), "max_tokens": 5, "return_token_ids": True, "logprobs": True, "top_logprobs": 0}
    choice = post(vllm_server, "/chat/completions", request)["choices"][0]

    entries = choice["logprobs"]["content"]
    assert len(entries) == len(choice["token_ids"])
    assert all(entry["logprob"] <= 0 and entry["top_logprobs"] == [] for entry in entries)


@pytest.mark.vllm
def test_a_prompt_longer_than_the_context_is_an_openai_shaped_400(vllm_server) -> None:
    too_long = [{"role": "user", "content": "hello " * 600}]
    response = httpx.post(
        f"{vllm_server.base_url}/chat/completions",
        json={"model": vllm_server.model, "messages": too_long, "max_tokens": 4},
        timeout=120,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == 400 and "maximum context length" in error["message"]
