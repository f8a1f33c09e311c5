"""Test files mirror the modules they test: ``tests/<path>/test_<name>.py`` for ``meshshard/<path>/[_]<name>.py``.

A directory or module name in ``tests/`` drops the leading underscore of a private one
(``meshshard/tensor/_rules/_loss.py`` -> ``tests/tensor/rules/test_loss.py``); a package is tested by
``test_<package>.py`` beside its directory. Catalogues that cut across the package are listed in
:data:`CROSS_CUTTING` with the reason they stand apart.
"""

from __future__ import annotations

from pathlib import Path

import meshshard

PACKAGE = Path(meshshard.__file__).parent
TESTS = Path(__file__).parent

#: Test files that check the package as a whole rather than one module, and why.
CROSS_CUTTING = {
    "test_bad_input.py": "every public entry point (from the modules' __all__) fed bad input",
    "test_properties.py": "hypothesis properties of ShardTensor and neighbour search across world sizes",
    "test_layers.py": "the module-level import graph of the whole package",
    "test_readme.py": "runs every Python block of README.md",
    "test_first_hour.py": "a new user's first hour: install, CLI, messages, examples",
    "test_test_layout.py": "this check",
    "test_example_pointnet.py": "examples/train_pointnet_drivaerml.py, a complete script, against one process",
    "test_example_transolver.py": "examples/train_transolver_drivaerml.py, a complete script",
    "tensor/test_opinfo_sweep.py": "torch's OpInfo database against every sharding rule",
    "tensor/test_findings.py": "the tensor core's past silent wrong answers, one regression test each",
    "tensor/rules/test_adaptive.py": "adaptive pools of tensor/_rules/_grid.py (test_grid.py holds the other grid ops)",
    "test_boundary.py": "the library/applications boundary: no exit outside meshshard/cli, errors are Exceptions",
}


def _module_for(test: Path) -> Path | None:
    """The module (or package ``__init__``) that ``test`` mirrors, or ``None``."""
    rel = test.relative_to(TESTS)
    folder = PACKAGE
    for part in rel.parts[:-1]:
        for name in (part, f"_{part}"):
            if (folder / name).is_dir():
                folder = folder / name
                break
        else:
            return None
    stem = rel.name.removeprefix("test_").removesuffix(".py")
    for name in (stem, f"_{stem}"):
        if (folder / f"{name}.py").is_file():
            return folder / f"{name}.py"
        if (folder / name / "__init__.py").is_file():
            return folder / name / "__init__.py"
    return None


def test_every_test_file_mirrors_a_module_or_is_a_listed_catalogue():
    tests = sorted(p for p in TESTS.rglob("test_*.py"))
    assert len(tests) > 20  # the walk sees the suite
    orphans = [
        str(p.relative_to(TESTS))
        for p in tests
        if str(p.relative_to(TESTS)) not in CROSS_CUTTING and _module_for(p) is None
    ]
    assert not orphans, f"test files that mirror no module (rename them, or list them in CROSS_CUTTING): {orphans}"


def test_listed_catalogues_exist():
    missing = [name for name in CROSS_CUTTING if not (TESTS / name).is_file()]
    assert not missing, missing


def test_the_mapping_reads_private_names():
    assert _module_for(TESTS / "tensor" / "rules" / "test_loss.py") == PACKAGE / "tensor" / "_rules" / "_loss.py"
    assert _module_for(TESTS / "test_halo.py") == PACKAGE / "halo.py"
    assert _module_for(TESTS / "tensor" / "test_rules.py") == PACKAGE / "tensor" / "_rules" / "__init__.py"
    assert _module_for(TESTS / "test_nothing_here.py") is None
