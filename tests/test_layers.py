"""The layers of meshshard: no import cycle, every import goes down a layer, lower layers import alone, and
no module imports another package's private module or private name.

The graph is read from the source with :mod:`ast` (nothing is imported): an edge ``a -> b`` for every
``import``/``from ... import`` at the top level of module ``a`` (also inside top-level ``if``/``try``/``with``,
but not under ``if TYPE_CHECKING:`` and not inside functions, whose imports run on first use). Importing
``a.b.c`` runs the ``__init__`` of ``a.b`` too, so the edge also goes to the target's parent packages, except
those that contain the importing module (they are being initialised already).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import meshshard

PACKAGE = Path(meshshard.__file__).parent
ROOT = PACKAGE.parent

#: The layers, lowest first (``shared/DESIGN.md``): a module may import, at module level, only modules of its
#: own layer or lower ones. A module's layer is that of the longest prefix listed here; a meshshard module
#: that no prefix matches fails the test, so a new module must be given a layer.
LAYERS: dict[str, int] = {
    "meshshard": 0,  # the package itself: names are imported on first use (PEP 562)
    "meshshard.errors": 0,
    "meshshard._checks": 0,
    "meshshard._sizes": 0,
    "meshshard._atomic": 0,
    "meshshard._spawn": 0,
    "meshshard._config": 0,  # TransolverConfig: standard library only, so the CLI's --help stays light
    "meshshard._keyed_random": 0,  # counter-based random numbers
    "meshshard._records": 0,  # frozen report records with dict-style access (standard library only)
    "meshshard._lazy": 0,  # the packages' PEP 562 lazy names (standard library only)
    "meshshard._op_names": 0,  # an op's readable name for error messages (torch only)
    "meshshard.partition": 1,  # geometry
    "meshshard.kernels": 2,  # local neighbour kernels
    "meshshard.comm": 3,
    "meshshard.device_mesh": 3,
    "meshshard.faults": 3,
    "meshshard.tensor": 4,
    "meshshard.halo": 5,
    "meshshard.ops": 6,
    "meshshard.nn": 7,
    "meshshard.io": 8,
    "meshshard.datasets": 9,
    "meshshard.training": 10,  # workflows
    "meshshard.planning": 10,
    "meshshard.cli": 11,
    "meshshard.testing": 12,  # test support, on top
}


def layer_of(module: str) -> int | None:
    """The layer of ``module`` (longest listed prefix), or ``None`` when no prefix matches.

    ``"meshshard"`` names the package's own ``__init__`` only, not a prefix of every module.
    """
    parts = module.split(".")
    for i in range(len(parts), 1, -1):
        rank = LAYERS.get(".".join(parts[:i]))
        if rank is not None:
            return rank
    return LAYERS.get(module)


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    """The edges of ``graph`` from a module to a module of a higher layer, as readable lines."""
    return sorted(
        f"{source} (layer {layer_of(source)}) -> {target} (layer {layer_of(target)})"
        for source, targets in graph.items()
        for target in targets
        if None not in (layer_of(source), layer_of(target)) and layer_of(target) > layer_of(source)
    )


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is_package) for every module of meshshard."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _imported_names(module: str, is_package: bool, tree: ast.Module):
    """``(line, dotted name)`` for everything ``module`` imports, anywhere in it (functions included).

    ``import a.b as c`` gives ``a.b``; ``from a.b import c`` gives ``a.b.c`` (``c`` a module or a name);
    relative imports are resolved against the importing module's package.
    """
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def private_owner(target: str, packages: set[str]) -> str | None:
    """The package whose private module or name ``target`` reaches, or ``None`` when it reaches none.

    The first component after ``meshshard`` that starts with ``_`` (not a dunder) is private to the package
    it sits in: ``meshshard.partition._rcb.rcb`` to ``meshshard.partition``, ``meshshard.ops.neighbors._x``
    to ``meshshard.ops`` (a private name of a module belongs to that module's package). Top-level
    ``meshshard._x`` modules (``_checks``, ``_sizes``, ``_records``...) are the root package's shared
    internals: private to ``meshshard``, so importable anywhere in it.
    """
    parts = target.split(".")
    if parts[0] != "meshshard":
        return None
    for i in range(1, len(parts)):
        if parts[i].startswith("_") and not parts[i].startswith("__"):
            owner = ".".join(parts[:i])
            return owner if owner in packages else owner.rpartition(".")[0]
    return None


def private_imports() -> list[str]:
    """Every import, in any meshshard module, of a private module or name from outside its package."""
    modules = _modules()
    packages = {name for name, (_, is_package) in modules.items() if is_package}
    found = []
    for name, (path, is_package) in modules.items():
        for line, target in _imported_names(name, is_package, ast.parse(path.read_text(encoding="utf-8"))):
            owner = private_owner(target, packages)
            if owner is not None and name != owner and not name.startswith(owner + "."):
                found.append(f"{path.relative_to(ROOT)}:{line}: {name} imports {target} (private to {owner})")
    return sorted(found)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _top_level_imports(node.body)
            yield from _top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _top_level_imports(block)
        elif isinstance(node, ast.With):
            yield from _top_level_imports(node.body)


def import_graph() -> dict[str, set[str]]:
    """Module -> the meshshard modules that importing it runs (module level only)."""
    modules = _modules()
    graph = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        targets = set()
        for node in _top_level_imports(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets.add(target)
            targets.update(f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules)
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        run = set()
        for target in targets:
            parts = target.split(".")
            run.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        graph[name] = {t for t in run if t in modules and t != name and t not in ancestors}
    return graph


def strongly_connected_components(graph: dict[str, set[str]]) -> list[set[str]]:
    """Kosaraju's algorithm (iterative); components of one module without a self-edge are left out."""
    order, seen = [], set()
    for start in graph:
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(sorted(graph[start])))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                order.append(node)
            elif child not in seen:
                seen.add(child)
                stack.append((child, iter(sorted(graph[child]))))
    reverse: dict[str, set[str]] = {n: set() for n in graph}
    for node, targets in graph.items():
        for target in targets:
            reverse[target].add(node)
    components, assigned = [], set()
    for start in reversed(order):
        if start in assigned:
            continue
        component, todo = set(), [start]
        assigned.add(start)
        while todo:
            node = todo.pop()
            component.add(node)
            for parent in reverse[node] - assigned:
                assigned.add(parent)
                todo.append(parent)
        if len(component) > 1 or start in graph[start]:
            components.append(component)
    return components


def test_the_graph_reader_sees_the_imports():
    graph = import_graph()
    assert "meshshard.device_mesh" in graph and "meshshard.partition" in graph
    assert "meshshard.tensor" in graph["meshshard.ops.neighbors"]  # from ..tensor import ...
    assert "meshshard.ops.slice_tokens" in graph["meshshard.ops"]  # from .slice_tokens import ...
    assert "meshshard.tensor" not in graph["meshshard"]  # only under TYPE_CHECKING / imported on first use


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert sorted(map(sorted, strongly_connected_components(graph))) == [["a", "b", "c"], ["e"]]


def test_module_level_imports_form_no_cycle():
    cycles = strongly_connected_components(import_graph())
    assert not cycles, f"import cycles among meshshard modules: {sorted(map(sorted, cycles))}"


def test_every_module_has_a_layer():
    unknown = sorted(m for m in _modules() if layer_of(m) is None)
    assert not unknown, f"meshshard modules without a layer (add them to LAYERS): {unknown}"


def test_the_layer_table_ranks_by_longest_prefix():
    assert layer_of("meshshard.partition._rcb") == LAYERS["meshshard.partition"]
    assert layer_of("meshshard.ops.parallel_partition") == LAYERS["meshshard.ops"]
    assert layer_of("meshshard.kernels._fused") == LAYERS["meshshard.kernels"]
    assert layer_of("meshshard.cli.train") == LAYERS["meshshard.cli"]
    assert layer_of("meshshard") == 0
    assert layer_of("meshshard.unknown") is None and layer_of("meshshardx.ops") is None


def test_the_layer_check_finds_an_upward_edge():
    graph = {"meshshard.partition._core": {"meshshard.io", "meshshard._checks"}, "meshshard.ops": {"meshshard.halo"}}
    assert upward_edges(graph) == ["meshshard.partition._core (layer 1) -> meshshard.io (layer 8)"]


def test_module_level_imports_go_to_the_same_or_a_lower_layer():
    upward = upward_edges(import_graph())
    assert not upward, "imports that reach up a layer:\n" + "\n".join(upward)


def test_the_private_import_reader_resolves_every_form():
    code = (
        "import meshshard.partition._rcb as rcb_module\n"
        "from ..partition import _cells\n"
        "from ..io._read import read_mesh\n"
        "from . import _spec\n"
        "def f():\n"
        "    from ..ops.neighbors import _check, knn\n"
        "    from .._checks import check_positive_int\n"
    )
    names = [t for _, t in _imported_names("meshshard.tensor._tensor", False, ast.parse(code))]
    assert names == [
        "meshshard.partition._rcb",
        "meshshard.partition._cells",
        "meshshard.io._read.read_mesh",
        "meshshard.tensor._spec",
        "meshshard.ops.neighbors._check",
        "meshshard.ops.neighbors.knn",
        "meshshard._checks.check_positive_int",
    ]
    packages = {"meshshard", "meshshard.partition", "meshshard.io", "meshshard.ops", "meshshard.tensor"}
    owners = {t: private_owner(t, packages) for t in names}
    assert owners == {
        "meshshard.partition._rcb": "meshshard.partition",
        "meshshard.partition._cells": "meshshard.partition",
        "meshshard.io._read.read_mesh": "meshshard.io",
        "meshshard.tensor._spec": "meshshard.tensor",
        "meshshard.ops.neighbors._check": "meshshard.ops",
        "meshshard.ops.neighbors.knn": None,
        "meshshard._checks.check_positive_int": "meshshard",
    }


def test_no_module_imports_another_packages_private_module_or_name():
    found = private_imports()
    assert not found, "imports of another package's private module or name (export what is shared):\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    "module, must_not_load",
    [
        ("meshshard.partition", ["meshshard.tensor", "meshshard.ops", "meshshard.nn", "torch.distributed.tensor"]),
        ("meshshard.kernels", [
            "meshshard.comm", "meshshard.tensor", "meshshard.halo", "meshshard.ops", "meshshard.nn"
        ]),
        ("meshshard.halo", ["meshshard.ops", "meshshard.nn", "meshshard.datasets", "meshshard.io"]),
        ("meshshard.tensor", ["meshshard.ops", "meshshard.nn", "meshshard.datasets", "meshshard.io"]),
        ("meshshard.ops", ["meshshard.nn", "meshshard.datasets", "meshshard.io"]),
    ],
)
def test_a_lower_layer_imports_without_the_layers_above(module, must_not_load):
    code = f"import sys, {module}; print(' '.join(m for m in {must_not_load!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == [], f"import {module} also loaded {res.stdout.split()}"
