"""Tool-call ids made as vLLM's chat endpoint makes them, in each parser's style, for a deployment that names it.

The hermes style (the default) is checked against vLLM itself in `test_chain_answers_vllm.py`; Kimi-K2's and
Mistral's parsers need their own models, so their shapes are checked here, from vLLM 0.31's `make_tool_call_id`
and `MistralToolCall.generate_random_id`.
"""

from __future__ import annotations

import re

import pytest

from agl_proxy.chain.tool_call_ids import name_tool_calls, tool_call_id
from agl_proxy.common.deployments import parse_deployment

from .helpers import model_entry


def test_each_style_makes_vllm_s_ids() -> None:
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", tool_call_id("random", "clock", 0))
    assert tool_call_id("kimi_k2", "get_weather", 3) == "functions.get_weather:3"
    mistral = {tool_call_id("mistral", "clock", 0) for _ in range(20)}
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in mistral)
    assert len(mistral) == 20  # drawn, not numbered


def test_kimi_ids_number_on_from_the_calls_already_in_the_conversation() -> None:
    history = [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "functions.get_weather:0"}] * 2},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sun"},
        {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "rain"},
    ]
    calls = [
        {"id": "6f1c2e0a9b3d4c5e", "type": "function", "function": {"name": name, "arguments": "{}"}}
        for name in ("get_weather", "get_time")
    ]
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "tool_calls": calls}}]}

    name_tool_calls(answer, {"messages": history}, "kimi_k2")

    assert [c["id"] for c in calls] == ["functions.get_weather:2", "functions.get_time:3"]


def test_a_deployment_names_its_parser_s_style() -> None:
    assert parse_deployment(model_entry("m", "http://a/v1")).tool_call_ids == "random"
    kimi = parse_deployment(model_entry("m", "http://a/v1", agl_tool_call_ids="kimi_k2"))
    assert kimi.tool_call_ids == "kimi_k2"
    with pytest.raises(ValueError, match="agl_tool_call_ids must be one of random, kimi_k2, mistral"):
        parse_deployment(model_entry("m", "http://a/v1", agl_tool_call_ids="hermes"))
