"""No function in memx_hpc/ is over 100 lines (issue 25): a function longer than a couple of
screens is split into named steps (see memx_hpc/train/args.py: one helper per argument group)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "memx_hpc"
MAX_LINES = 100


def long_functions(source: str, name: str, limit: int = MAX_LINES) -> list[str]:
    """``name:line function (N lines)`` for each function or method of ``source`` over ``limit``
    lines, its decorators and docstring included."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = node.end_lineno - first + 1
            if n > limit:
                out.append(f"{name}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_is_over_100_lines():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    assert not found, "functions over 100 lines:\n" + "\n".join(found)


def test_the_length_check_sees_a_long_function():
    body = "def f():\n" + "    x = 1\n" * 100
    assert long_functions(body, "m.py") == ["m.py:1 f (101 lines)"]
    assert long_functions("def g():\n    return 1\n", "m.py") == []
