"""No function in ``meshshard/`` is over 80 lines of code (complexity is ruff's ``C901``, limit 15 in pyproject).

A line of code is a line of the function that is neither blank, a comment nor its docstring; a nested
function counts toward the one that holds it. A longer function is split along its seams, or listed
in :data:`EXCEPTIONS` with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "meshshard"
LIMIT = 80
#: ``"path/in/package.py:function"``: why it stays long (none today)
EXCEPTIONS: dict[str, str] = {}


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[int]:
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return set(range(first.lineno, first.end_lineno + 1))
    return set()


def code_lines(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of code of ``node`` (signature included; blank, comment and docstring lines left out)."""
    doc = _docstring_lines(node)
    body = (lines[i - 1].strip() for i in range(node.lineno, node.end_lineno + 1) if i not in doc)
    return sum(1 for text in body if text and not text.startswith("#"))


def long_functions() -> dict[str, int]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n := code_lines(lines, node)) > LIMIT:
                found[f"{path.relative_to(PACKAGE)}:{node.name}"] = n
    return found


def test_the_counter_skips_docstrings_comments_and_blank_lines():
    source = 'def f(x):\n    """Doc.\n\n    More.\n    """\n    # a comment\n\n    y = x\n    return y\n'
    node = ast.parse(source).body[0]
    assert code_lines(source.splitlines(), node) == 3  # def, y = x, return y


def test_no_function_is_over_the_limit_unless_listed():
    found = long_functions()
    unlisted = {name: n for name, n in found.items() if name not in EXCEPTIONS}
    assert not unlisted, f"functions over {LIMIT} lines of code (split them, or list them with a reason): {unlisted}"
    stale = sorted(set(EXCEPTIONS) - set(found))
    assert not stale, f"listed exceptions that are no longer long (remove them from EXCEPTIONS): {stale}"
