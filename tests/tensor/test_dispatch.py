"""``meshshard/tensor/_dispatch.py``: the rule registry and argument normalisation (``bind``)."""

from __future__ import annotations

import pytest
import torch

from meshshard.errors import UnsupportedOpError
from meshshard.tensor import has_rule, register_rule
from meshshard.tensor._dispatch import bind, op_name

NAMES = ("input", "dim", "keepdim")


def test_bind_maps_positional_keyword_and_alias_forms_onto_one_dict():
    want = {"input": "x", "dim": 0, "keepdim": True}
    assert bind(torch.sum, ("x", 0, True), {}, NAMES) == want
    assert bind(torch.sum, ("x",), {"dim": 0, "keepdim": True}, NAMES) == want
    assert bind(torch.sum, ("x",), {"axis": 0, "keepdims": True}, NAMES) == want


def test_bind_fills_defaults_and_keyword_only_names():
    got = bind(torch.sum, ("x",), {"dtype": torch.float64}, NAMES, {"keepdim": False}, kwonly=("dtype",))
    assert got == {"input": "x", "dim": None, "keepdim": False, "dtype": torch.float64}


def test_bind_accepts_out_none_only():
    assert bind(torch.sum, ("x",), {"out": None}, NAMES)["dim"] is None
    with pytest.raises(UnsupportedOpError, match=r"does not support the argument 'out' \(write the result"):
        bind(torch.sum, ("x",), {"out": torch.empty(1)}, NAMES)


def test_bind_refuses_undeclared_keywords_and_extra_positionals():
    with pytest.raises(UnsupportedOpError, match=r"torch.sum on a ShardTensor does not support the argument 'foo'"):
        bind(torch.sum, ("x",), {"foo": 1}, NAMES)
    with pytest.raises(UnsupportedOpError, match=r"expected at most 3 positional arguments .* \(got 4\)"):
        bind(torch.sum, ("x", 0, True, 1), {}, NAMES)
    with pytest.raises(TypeError, match=r"got multiple values for argument 'dim'"):
        bind(torch.sum, ("x", 0), {"axis": 1}, NAMES)


def test_register_rule_registers_and_a_later_rule_replaces_the_earlier():
    def func(x):  # a user's own function: no built-in rule can exist for it
        return x

    assert not has_rule(func)
    from meshshard.tensor import _dispatch

    try:

        @register_rule(func)
        def first(f, args, kwargs):
            return "first"

        assert has_rule(func) and _dispatch._RULES[func] is first

        @register_rule(func)
        def second(f, args, kwargs):
            return "second"

        assert _dispatch._RULES[func] is second
    finally:
        _dispatch._RULES.pop(func, None)
    assert not has_rule(func)


def test_op_name_is_the_public_torch_name():
    assert op_name(torch.sum) == "torch.sum"
    assert op_name(torch.Tensor.sum) == "torch.Tensor.sum"
