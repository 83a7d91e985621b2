"""Codex CLI's and Claude Code's requests, as they send them, through the Responses and Messages APIs.

`fixtures/codex_0.169.0_first_request.json` is the first request Codex CLI 0.169.0 sent to a
capturing server (`codex exec "Say hello"`), `codex_0.169.0_after_a_tool_call.json` its second
after the capturing server answered the first with this proxy's Responses events for a call of
`exec_command {"cmd": "echo hi"}` (Codex ran it). `claude_code_2.1.332_first_request.json` is the first
request Claude Code 2.1.332 sent to a capturing server (`claude -p "Say hello."`), its prose left out
(Anthropic's licence); `fixtures/claude_code_requests.json` is written by hand from Anthropic's docs:
the typed client tools, server tools and history blocks a first call does not show. The model's calls
back are written out as chat answers: a tiny random model never makes one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agl_proxy.server.proxy import LLMProxy
from agl_proxy.translate.messages import MESSAGES
from agl_proxy.translate.responses import RESPONSES

from .helpers import wait_for_spans
from .test_client_apis import chat_answer, events

FIXTURES = Path(__file__).parent / "fixtures"
CODEX = json.loads((FIXTURES / "codex_0.169.0_first_request.json").read_text())
CODEX_AFTER_CALL = json.loads((FIXTURES / "codex_0.169.0_after_a_tool_call.json").read_text())
CLAUDE = json.loads((FIXTURES / "claude_code_requests.json").read_text())
CLAUDE_FIRST = json.loads((FIXTURES / "claude_code_2.1.332_first_request.json").read_text())["request"]

PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.", "format": {
    "type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"}}  # fmt: skip
SHELL = {"type": "local_shell"}
CRM = {"type": "namespace", "name": "crm", "description": "The CRM.", "tools": [
    {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
    {"type": "custom", "name": "note"}]}  # fmt: skip
LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}


def names(chat: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in chat.get("tools", ())]


def test_codex_first_request_flattens_its_namespace_and_leaves_web_search_out() -> None:
    chat = RESPONSES.chat_request(CODEX)

    namespace = next(tool for tool in CODEX["tools"] if tool["type"] == "namespace")
    inner = [tool["name"] for tool in namespace["tools"]]
    assert set(inner) <= set(names(chat)) and "exec_command" in names(chat)
    assert len(names(chat)) == len(CODEX["tools"]) - 2 + len(inner)  # less the namespace and web_search
    assert RESPONSES.tools_left_out(CODEX) == ["web_search"]
    assert [m["role"] for m in chat["messages"]] == ["system", "system", "user", "user"]
    assert chat["messages"][-1]["content"] == "Say hello" and chat["stream"] is True
    assert "reasoning_effort" not in chat  # Codex asks for a reasoning summary only


def test_codex_request_after_a_tool_call_replays_the_call_and_its_output() -> None:
    *_, user, assistant, result = RESPONSES.chat_request(CODEX_AFTER_CALL)["messages"]

    assert user == {"role": "user", "content": "Run echo hi"}
    assert assistant == {
        "role": "assistant",
        "content": None,
        "reasoning": "Run it.",
        "tool_calls": [call("exec_command", '{"cmd": "echo hi"}', "call_1")],
    }
    assert result["role"] == "tool" and result["tool_call_id"] == "call_1" and result["content"].endswith("hi\n")


def call(name: str, arguments: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_the_models_calls_go_back_as_the_items_of_each_tool() -> None:
    request = {"model": "m", "input": "hi", "tools": [PATCH, SHELL, CRM, LOOKUP]}
    chat = RESPONSES.chat_request(request)
    # `lookup` is taken by the top-level function: the namespace's is qualified.
    assert names(chat) == ["apply_patch", "local_shell", "crm__lookup", "note", "lookup"]
    patch_function = chat["tools"][0]["function"]
    assert patch_function["parameters"]["required"] == ["input"]
    assert "start: begin_patch" in patch_function["parameters"]["properties"]["input"]["description"]

    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    answer = chat_answer(
        content=None,
        tool_calls=[
            call("apply_patch", json.dumps({"input": patch}), "c1"),
            call("local_shell", '{"command": ["ls", "-l"], "timeout_ms": 5000}', "c2"),
            call("crm__lookup", '{"id": 7}', "c3"),
            call("lookup", "{}", "c4"),
        ],
    )
    output = RESPONSES.response(answer, request)["output"]
    assert [(item["type"], item["call_id"]) for item in output] == [
        ("custom_tool_call", "c1"), ("local_shell_call", "c2"), ("function_call", "c3"), ("function_call", "c4"),
    ]  # fmt: skip
    assert output[0]["input"] == patch and output[0]["name"] == "apply_patch"
    assert output[1]["action"] == {"type": "exec", "command": ["ls", "-l"], "timeout_ms": 5000}
    assert (output[2]["name"], output[2]["namespace"]) == ("lookup", "crm")
    assert "namespace" not in output[3]

    # The same calls, streamed: each item done is the final response's.
    stream = RESPONSES.stream(request)
    base = {"id": "chatcmpl-7", "created": 1, "model": "m"}
    chunks = [
        {
            **base,
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": i, "id": c["id"], "function": c["function"]}]}}
            ],
        }
        for i, c in enumerate(answer["choices"][0]["message"]["tool_calls"])
    ]
    got = events([event for chunk in chunks for event in stream.feed(chunk)] + stream.finish(answer))
    done = [e["item"] for e in got if e["type"] == "response.output_item.done"]
    assert done == got[-1]["response"]["output"] == output
    assert [e["input"] for e in got if e["type"] == "response.custom_tool_call_input.done"] == [patch]


def test_codex_history_items_become_chat_turns() -> None:
    request = {
        "model": "m",
        "tools": [PATCH, SHELL, CRM, {"type": "web_search"}],
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": None, "encrypted_content": None},
            {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"},
            {"type": "local_shell_call", "call_id": "c2", "status": "completed",
             "action": {"type": "exec", "command": ["ls"]}},
            {"type": "local_shell_call_output", "id": "c2", "output": "a.txt"},
            {"type": "function_call", "call_id": "c3", "name": "lookup", "namespace": "crm", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c3", "output": "found"},
        ],
    }  # fmt: skip
    turns = RESPONSES.chat_request(request)["messages"]
    patch = call("apply_patch", '{"input": "*** Begin Patch"}', "c1")
    assert turns == [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": None, "reasoning": "", "tool_calls": [patch]},
        {"role": "tool", "tool_call_id": "c1", "content": "Done!"},
        {"role": "assistant", "content": None, "tool_calls": [call("local_shell", '{"command": ["ls"]}', "c2")]},
        {"role": "tool", "tool_call_id": "c2", "content": "a.txt"},
        {"role": "assistant", "content": None, "tool_calls": [call("lookup", "{}", "c3")]},
        {"role": "tool", "tool_call_id": "c3", "content": "found"},
    ]  # fmt: skip


def test_claude_code_s_own_first_request_maps_whole() -> None:
    """Its 12 tools as functions, its system blocks and the inline system message (a reminder it sends as a
    message) as system turns, its adaptive thinking, context edits and effort accepted, its 128,000 tokens
    asked as the chat limit (the token chain lowers a limit over the model's context)."""
    chat = MESSAGES.chat_request(CLAUDE_FIRST)
    assert names(chat) == [tool["name"] for tool in CLAUDE_FIRST["tools"]] and len(chat["tools"]) == 12
    assert MESSAGES.tools_left_out(CLAUDE_FIRST) == []
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "system"]
    assert chat["messages"][1]["content"][-1] == {"type": "text", "text": "Say hello."}
    assert chat["max_tokens"] == 128_000 and chat["stream"] is True


def test_claude_code_requests_map_with_server_tools_left_out() -> None:
    first = MESSAGES.chat_request(CLAUDE["first"])
    assert names(first) == ["Bash", "Read"] and MESSAGES.tools_left_out(CLAUDE["first"]) == ["web_search_20250305"]
    assert first["messages"][0]["role"] == "system" and first["messages"][0]["content"].startswith("You are Claude")
    assert first["max_tokens"] == 32000 and first["temperature"] == 1

    later = MESSAGES.chat_request(CLAUDE["later"])
    assert names(later) == ["bash", "str_replace_based_edit_tool"]
    editor = later["tools"][1]["function"]["parameters"]
    assert editor["required"] == ["command", "path"] and "str_replace" in editor["properties"]["command"]["enum"]
    assert MESSAGES.tools_left_out(CLAUDE["later"]) == ["web_search_20250305", "web_fetch_20250910"]
    system, user, assistant, result, go_on = later["messages"]
    assert user["content"][0] == {"type": "text", "text": "calc.py\n\ndef add(a, b):\n    return a - b\n"}
    # The server tool's use and result are dropped; the thinking, text and client tool call stay.
    assert assistant["reasoning"] == "Look it up, then read the file."
    assert assistant["content"] == "Let me look at the file."
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["str_replace_based_edit_tool"]
    assert result == {
        "role": "tool",
        "tool_call_id": "toolu_01",
        "content": "1: def add(a, b):\n2:     return a - b\nREADME\n/repo/README.md\nadd adds.",
    }
    assert go_on == {"role": "user", "content": "Go on."}


async def test_the_answer_and_the_span_name_the_tools_left_out(new_rollout, proxy: LLMProxy, http, store) -> None:
    rollout_id, attempt_id = await new_rollout()
    headers = {"x-rollout-id": rollout_id, "x-attempt-id": attempt_id}
    codex = await http.post(proxy.base_url + "/responses", json={**CODEX, "model": "tiny"}, headers=headers)
    claude = await http.post(proxy.base_url + "/messages", json={**CLAUDE["later"], "model": "tiny"}, headers=headers)

    assert codex.status_code == claude.status_code == 200
    assert codex.headers["x-agl-tools-left-out"] == "web_search"
    assert claude.headers["x-agl-tools-left-out"] == "web_search_20250305,web_fetch_20250910"
    spans = await wait_for_spans(store, rollout_id, 2)
    assert [span.attributes["agl.tools_left_out"] for span in spans] == [
        ["web_search"],
        ["web_search_20250305", "web_fetch_20250910"],
    ]


def capped(completion_tokens: int) -> dict[str, Any]:
    """A chat answer cut for length after `completion_tokens` tokens."""
    answer = chat_answer(content="Half a thought")
    answer["choices"][0]["finish_reason"] = "length"
    answer["usage"] = {
        "prompt_tokens": 3,
        "completion_tokens": completion_tokens,
        "total_tokens": 3 + completion_tokens,
    }
    return answer


def test_a_turn_cut_by_the_proxys_cap_ends_as_a_normal_turn() -> None:
    # Claude Code asks for up to 32000 tokens; the proxy's cap (`all.max_tokens=9`) cut the answer at 9.
    cut_by_cap, cut_by_client = capped(9), capped(9)
    assert MESSAGES.response(cut_by_cap, {"max_tokens": 32000})["stop_reason"] == "end_turn"
    assert MESSAGES.response(cut_by_client, {"max_tokens": 9})["stop_reason"] == "max_tokens"
    stream = MESSAGES.stream({"max_tokens": 32000})
    assert events(stream.finish(cut_by_cap))[-2]["delta"]["stop_reason"] == "end_turn"

    # Codex sends no max_output_tokens: any cut is not its own.
    assert RESPONSES.response(cut_by_cap, {})["status"] == "completed"
    cut = RESPONSES.response(cut_by_client, {"max_output_tokens": 9})
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events(RESPONSES.stream({}).finish(cut_by_cap))[-1]["type"] == "response.completed"
