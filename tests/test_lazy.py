"""meshshard._lazy: one PEP 562 ``__getattr__``/``__dir__`` for every package (caching, ``__dir__``, errors)."""

from __future__ import annotations

import subprocess
import sys
import traceback
import types

import pytest

import meshshard
import meshshard.datasets
import meshshard.nn
import meshshard.partition
from meshshard._lazy import lazy_exports

PACKAGES = [meshshard, meshshard.nn, meshshard.datasets, meshshard.partition]


@pytest.fixture
def fake_package(monkeypatch, tmp_path):
    """A throwaway package ``lazypkg``: ``answer`` from ``_impl`` (a new object at every import), ``sub``."""
    root = tmp_path / "lazypkg"
    root.mkdir()
    (root / "__init__.py").write_text(
        "from meshshard._lazy import lazy_exports\n"
        "__all__ = ['answer', 'sub']\n"
        "__getattr__, __dir__ = lazy_exports(__name__, {'answer': '_impl'}, submodules=('sub',))\n"
    )
    (root / "_impl.py").write_text("answer = object()\n")
    (root / "sub.py").write_text("VALUE = 'sub'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("lazypkg", "lazypkg._impl", "lazypkg.sub"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import lazypkg

    yield lazypkg
    for name in ("lazypkg", "lazypkg._impl", "lazypkg.sub"):
        sys.modules.pop(name, None)


def test_first_use_imports_the_submodule_and_caches_the_value(fake_package):
    assert "answer" not in vars(fake_package) and "lazypkg._impl" not in sys.modules
    first = fake_package.answer
    assert "lazypkg._impl" in sys.modules and vars(fake_package)["answer"] is first
    del sys.modules["lazypkg._impl"]  # a second import would make a new object
    assert fake_package.answer is first  # cached in the namespace: __getattr__ is not asked again
    assert isinstance(fake_package.sub, types.ModuleType) and fake_package.sub.VALUE == "sub"


def test_dir_lists_lazy_names_before_they_are_imported(fake_package):
    names = dir(fake_package)
    assert {"answer", "sub", "__all__"} <= set(names) and names == sorted(names)
    assert "lazypkg._impl" not in sys.modules  # dir() imports nothing


def test_an_unknown_name_is_a_clear_attribute_error(fake_package):
    with pytest.raises(AttributeError, match=r"^module 'lazypkg' has no attribute 'anwser'$") as info:
        fake_package.anwser  # noqa: B018
    assert info.value.name == "anwser" and info.value.obj is fake_package
    # name and obj let Python's traceback suggest the public name
    if sys.version_info >= (3, 12):
        assert "Did you mean: 'answer'?" in "".join(traceback.format_exception(info.value))
    assert not hasattr(fake_package, "anwser")


def test_the_helper_alone():
    getattr_, dir_ = lazy_exports("meshshard", {"ShardingError": "errors"}, submodules=("planning",))
    assert getattr_("ShardingError") is meshshard.errors.ShardingError
    assert {"ShardingError", "planning"} <= set(dir_())
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        getattr_("nope")


@pytest.mark.parametrize("package", PACKAGES, ids=lambda m: m.__name__)
def test_every_package_uses_the_helper(package):
    assert package.__getattr__.__module__ == "meshshard._lazy"
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match=rf"^module '{package.__name__}' has no attribute 'no_such_name'$"):
        package.no_such_name  # noqa: B018


def test_lazy_names_of_every_package_resolve_and_stay_cached():
    """In a fresh interpreter (other tests import everything): each lazy name imports once, then is cached."""
    code = (
        "import meshshard, meshshard.nn, meshshard.partition, meshshard.datasets\n"
        "for pkg in (meshshard, meshshard.nn, meshshard.partition, meshshard.datasets):\n"
        "    for name in pkg.__all__:\n"
        "        if name == '__version__':\n"
        "            continue\n"
        "        value = getattr(pkg, name)\n"
        "        assert vars(pkg)[name] is value, (pkg.__name__, name)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_importing_the_library_loads_neither_dynamo_nor_dtensor():
    """Each rank, worker and CLI run imports meshshard: ``torch._dynamo`` and ``torch.distributed.tensor`` would
    add about 1.3 s to each. They load only when something compiles or uses a DTensor."""
    code = (
        "import sys\n"
        "import meshshard as ms, meshshard.nn, meshshard.ops, meshshard.tensor, meshshard.datasets\n"
        "x = ms.tensor.ShardTensor\n"
        "print(sorted(m for m in ('torch._dynamo', 'torch.distributed.tensor') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)
