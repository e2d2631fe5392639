"""A built-in example tool server (stdio MCP): a calculator and a clock. No network, no files.

Run as `python calc_clock_server.py`; the app starts it as a child process when a chat turns it on.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Literal

from pydantic import Field

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("calculator-clock", instructions="Arithmetic and the current time.")

OPERATORS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg,
    ast.UAdd: operator.pos}
FUNCTIONS: dict[str, Callable[..., float]] = {
    "sqrt": math.sqrt, "sin": math.sin, "cos": math.cos, "tan": math.tan, "log": math.log, "exp": math.exp, "abs": abs,
    "round": round}
CONSTANTS = {"pi": math.pi, "e": math.e}
MAX_POWER = 1000        # 9**9**9 would take the server's CPU for ever


def evaluate(expression: str) -> float | int:
    """An arithmetic expression's value: numbers, + - * / // % **, parentheses, FUNCTIONS and CONSTANTS; nothing
    else is evaluated (no names, attributes or calls of anything else)."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_POWER:
                raise ToolError(f"exponents above {MAX_POWER} are refused")
            return OPERATORS[type(node.op)](left, right)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS
                and not node.keywords):
            return FUNCTIONS[node.func.id](*(walk(a) for a in node.args))
        raise ToolError(f"not allowed in an expression: {ast.unparse(node)!r}")

    return walk(ast.parse(expression, mode="eval"))


@server.tool()
def calculate(expression: Annotated[str, Field(description="e.g. (2 + 3) * sqrt(16)", max_length=200)]) -> str:
    """Evaluate an arithmetic expression."""
    try:
        return f"{expression} = {evaluate(expression)}"
    except (SyntaxError, ArithmeticError, ValueError, TypeError) as e:
        raise ToolError(f"{expression!r} cannot be evaluated: {e}") from e


@server.tool()
def clock(zone: Literal["local", "UTC"] = "local") -> str:
    """The current date and time, in the computer's own time zone or in UTC."""
    now = datetime.now(timezone.utc) if zone == "UTC" else datetime.now().astimezone()
    return now.isoformat(timespec="seconds")


if __name__ == "__main__":
    server.run()
