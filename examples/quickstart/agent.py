"""An ordinary LangChain tool-calling agent. The only agl-specific input is its base URL."""

from __future__ import annotations

import ast
import operator
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses, e.g. '(3 + 4) * 12'."""

    def evaluate(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](evaluate(node.left), evaluate(node.right))
        raise ValueError(f"unsupported expression: {ast.dump(node)}")

    try:
        return str(evaluate(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"


async def run_agent(base_url: str, model: str, question: str, api_key: str = "none", max_turns: int = 3) -> str:
    """Answer `question`, calling the calculator when the model asks for it; returns the last reply."""
    llm = ChatOpenAI(base_url=base_url, api_key=api_key, model=model, temperature=0, max_tokens=48)
    agent = llm.bind_tools([calculator])
    messages: list[BaseMessage] = [
        SystemMessage("You are a careful math assistant. Use the calculator tool for arithmetic."),
        HumanMessage(question),
    ]
    reply: Any = None
    try:
        for _ in range(max_turns):
            reply = await agent.ainvoke(messages)
            messages.append(reply)
            if not reply.tool_calls:
                break
            for call in reply.tool_calls:
                messages.append(ToolMessage(content=calculator.invoke(call["args"]), tool_call_id=call["id"]))
    finally:
        await llm.root_async_client.close()
    return str(reply.content if reply is not None else "")
