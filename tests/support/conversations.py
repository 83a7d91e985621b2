"""Example chat requests for tests against the tiny model: plain messages, a tool, and a tool-call history.

The tiny model's random weights never produce a complete tool call, so a test that needs one puts it into
the history (``tool_history()``): an assistant turn with ``tool_calls`` and the ``tool`` result after it.
Each function returns a fresh copy, so a test may change what it gets.
"""

from __future__ import annotations

from typing import Any

TOOL_RESULT = '{"sky": "sunny", "celsius": 21}'


def messages() -> list[dict[str, Any]]:
    """A system prompt and one user question."""
    return [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the weather in Paris today?"},
    ]


def tools() -> list[dict[str, Any]]:
    """One OpenAI-style function tool, ``get_weather(city)``."""
    return [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]


def tool_history() -> list[dict[str, Any]]:
    """``messages()`` followed by an assistant call of ``get_weather`` (arguments as a JSON string) and its result."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    return [
        *messages(),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": TOOL_RESULT},
    ]


def responses_tool_input() -> list[dict[str, Any]]:
    """``tool_history()`` after its system message as Responses API input items: the question, the
    ``function_call`` item and its ``function_call_output`` (the system prompt goes in ``instructions``)."""
    _, question, assistant, result = tool_history()
    call = assistant["tool_calls"][0]
    return [
        {"role": "user", "content": question["content"]},
        {
            "type": "function_call",
            "call_id": call["id"],
            "name": "get_weather",
            "arguments": call["function"]["arguments"],
        },
        {"type": "function_call_output", "call_id": call["id"], "output": result["content"]},
    ]


def anthropic_tool_messages(thinking: str | None = None) -> list[dict[str, Any]]:
    """``tool_history()`` after its system message as Anthropic Messages: the question, an assistant
    ``tool_use`` block (after a ``thinking`` block when given) and the user's ``tool_result`` block."""
    _, question, assistant, result = tool_history()
    call = assistant["tool_calls"][0]
    blocks: list[dict[str, Any]] = []
    if thinking is not None:
        blocks.append({"type": "thinking", "thinking": thinking, "signature": "sig"})
    blocks.append({"type": "tool_use", "id": call["id"], "name": "get_weather", "input": {"city": "Paris"}})
    return [
        {"role": "user", "content": question["content"]},
        {"role": "assistant", "content": blocks},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": result["content"]}]},
    ]


def anthropic_tools() -> list[dict[str, Any]]:
    """``tools()`` as Anthropic tools."""
    function = tools()[0]["function"]
    return [{"name": function["name"], "description": function["description"], "input_schema": function["parameters"]}]


async def langchain_tool_conversation(llm: Any) -> tuple[Any, list[Any]]:
    """Two turns of a LangChain agent with ``tools()`` bound to ``llm``: ``messages()`` as LangChain
    messages, then, streamed, the same history with the call of ``get_weather`` and its result.

    Returns the first answer and the second's chunks.
    """
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    agent = llm.bind_tools(tools())
    system, question = messages()
    history: list[Any] = [SystemMessage(system["content"]), HumanMessage(question["content"])]
    first = await agent.ainvoke(history)
    history += [
        AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}]),
        ToolMessage(content=TOOL_RESULT, tool_call_id="call_1"),
    ]
    return first, [chunk async for chunk in agent.astream(history)]
