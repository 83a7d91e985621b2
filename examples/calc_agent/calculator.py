"""A safe calculator for the agent's tool: + - * / ** and parentheses over numbers, nothing else."""

from __future__ import annotations

import ast
import math
import operator
import re

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64


def calculate(expression: str) -> float:
    """Evaluate an arithmetic expression; ValueError for anything that is not one."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    return float(_eval(tree.body))


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError("exponent too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported syntax: {ast.dump(node)[:60]}")


def format_number(value: float) -> str:
    """`12.0` → `12`, `2.5` → `2.5`: how answers are written and compared."""
    return str(int(value)) if math.isfinite(value) and value == int(value) else f"{value:.6g}"


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def final_number(text: str | None) -> float | None:
    """The last number in the agent's final message (None if it wrote none)."""
    found = _NUMBER.findall(text or "")
    return float(found[-1]) if found else None
