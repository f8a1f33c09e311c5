"""One boundary: only ``meshshard/cli/`` exits the interpreter; the library raises ``Exception``s.

An ``ast`` walk over every module outside ``meshshard/cli/``: no ``raise SystemExit``, no
``sys.exit``/``os._exit``/``exit``/``quit`` calls (a script's ``if __name__ == "__main__":`` block
aside), and no exception class of :mod:`meshshard.errors` is a ``SystemExit``. There are no
exceptions: the GPU check, which kills its own child process on purpose, lives in ``tools/``, outside
the installed package.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import meshshard
import meshshard.errors

ROOT = Path(meshshard.__file__).parent
EXITS = {("sys", "exit"), ("os", "_exit")}

def _is_main_guard(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def _exits(tree: ast.AST) -> list[int]:
    lines = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_main_guard(node):
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id == "SystemExit":
                lines.append(node.lineno)
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in EXITS:
                lines.append(node.lineno)
            if isinstance(f, ast.Name) and f.id in ("exit", "quit"):
                lines.append(node.lineno)
        if isinstance(node, ast.ClassDef):
            bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
            if "SystemExit" in bases:
                lines.append(node.lineno)
    return sorted(lines)


def test_no_module_outside_the_cli_exits():
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "cli":
            continue
        lines = _exits(ast.parse(path.read_text(), str(path)))
        if lines:
            found[str(rel)] = lines
    assert not found, f"SystemExit / sys.exit outside meshshard/cli/: {found}"


def test_the_walk_finds_an_exit():
    assert _exits(ast.parse("import sys\ndef f():\n    sys.exit(2)\nclass E(SystemExit): pass\nraise SystemExit(1)\n"))
    assert not _exits(ast.parse("import sys\nif __name__ == '__main__':\n    sys.exit(0)\n"))


def test_every_meshshard_error_is_an_exception():
    members = inspect.getmembers(meshshard.errors, inspect.isclass)
    classes = [c for _, c in members if c.__module__ == "meshshard.errors"]
    assert {"UsageError", "RunFailed", "ShardingError"} <= {c.__name__ for c in classes}
    for cls in classes:
        assert issubclass(cls, Exception) and not issubclass(cls, SystemExit), cls
