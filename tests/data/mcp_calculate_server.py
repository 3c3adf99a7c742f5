"""A stand-in for PyPI's `mcp-server-calculator` (official `mcp` SDK, stdio): one tool, `calculate(expression)`,
whose name clashes with the sandbox catalog's `calculate`.

The real package (0.2.1) pins `mcp<2`, which cannot be installed beside the `mcp>=2.3` this project uses,
so the tests run this server instead: same tool name, same argument, same kind of answer (the value as
text; an error for an expression it cannot evaluate). Only + - * / ** and parentheses on numbers.
"""
import ast
import operator

from mcp.server.mcpserver import MCPServer

server = MCPServer("calculator")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


@server.tool()
def calculate(expression: str) -> str:
    """Calculates/evaluates the given expression."""
    return str(_eval(ast.parse(expression, mode="eval")))


if __name__ == "__main__":
    server.run("stdio")
