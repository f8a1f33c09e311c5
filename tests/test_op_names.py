"""``meshshard/_op_names.py``: the one definition of an op's readable name."""

from __future__ import annotations

import pathlib
import re

import torch

from meshshard._op_names import op_name

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "meshshard"


def test_names_of_torch_functions_methods_and_plain_callables():
    assert op_name(torch.add) == "torch.add"
    assert op_name(torch.Tensor.sum) == "torch.Tensor.sum"
    assert op_name(torch.nn.functional.layer_norm) == "torch.nn.functional.layer_norm"

    def my_op(x):
        return x

    assert op_name(my_op) == "my_op"


def test_a_callable_without_a_name_falls_back_to_its_repr():
    class Op:
        def __call__(self, x):
            return x

        def __repr__(self):
            return "<Op>"

    assert op_name(Op()) == "<Op>"


def test_op_names_have_one_definition_in_the_package():
    defining = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"^def _?op_name\(|resolve_name\(", path.read_text(), re.MULTILINE)
    )
    assert defining == ["_op_names.py"]


def test_the_compile_constant_mark_is_what_dynamo_sets():
    """``op_name`` is marked as dynamo's ``assume_constant_result`` would mark it, without importing dynamo."""
    import torch._dynamo

    from meshshard._op_names import CONSTANT_RESULT_MARK

    def probe():
        return None

    torch._dynamo.assume_constant_result(probe)
    assert vars(probe) == {CONSTANT_RESULT_MARK: True}
    assert getattr(op_name, CONSTANT_RESULT_MARK) is True
