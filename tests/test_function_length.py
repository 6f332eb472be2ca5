"""The developers' rule: no function in src/ longer than 80 lines (its docstring excluded)."""

import ast
from pathlib import Path

import mrp_hf

LIMIT = 80


def function_lengths(root: Path):
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                body = body[1:]
            if body:
                yield f"{path.relative_to(root.parent)}:{node.lineno} {node.name}", body[-1].end_lineno - body[0].lineno + 1


def test_no_function_in_src_is_longer_than_80_lines():
    root = Path(mrp_hf.__file__).parent
    too_long = {name: length for name, length in function_lengths(root) if length > LIMIT}
    assert not too_long, too_long
