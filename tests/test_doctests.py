"""Every ``>>>`` example in the package's docstrings runs, one test per module.

An example that cannot run here (it needs a process group, a store, or a mesh of the user's own) is
marked ``# doctest: +SKIP``, and its docstring says why in a sentence starting "Not run as a doctest:".
Examples that write files go through :mod:`tempfile`, pointed at pytest's ``tmp_path``.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import tempfile

import pytest

import meshshard

PACKAGE_DIR = meshshard.__path__[0]
REASON = "Not run as a doctest:"


def _module_names() -> list[str]:
    names = ["meshshard"]
    for info in pkgutil.walk_packages(meshshard.__path__, "meshshard."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return names


def _doctests(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder().find(module, name)
    # only docstrings written in this module (not those of names it imports)
    return [t for t in tests if t.examples and t.filename and t.filename.startswith(PACKAGE_DIR)
            and importlib.import_module(name).__file__ == t.filename]


def _modules_with_examples() -> list[str]:
    return [name for name in _module_names() if _doctests(name)]


MODULES = _modules_with_examples()


def test_the_walk_finds_the_examples():
    total = sum(len(t.examples) for name in MODULES for t in _doctests(name))
    assert len(MODULES) >= 15 and total >= 50, (len(MODULES), total)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    failures = []
    for test in _doctests(name):
        skipped = [e for e in test.examples if e.options.get(doctest.SKIP)]
        if skipped and REASON not in (test.docstring or ""):
            failures.append(f"{test.name}: {len(skipped)} skipped example(s) without '{REASON} <why>'")
        runner = doctest.DocTestRunner(optionflags=flags)
        out: list[str] = []
        result = runner.run(test, out=out.append)
        if result.failed:
            failures.append("".join(out))
    assert not failures, "\n".join(failures)
