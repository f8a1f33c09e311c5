"""Test-only fault injection for the training loop, kept out of the product code.

A test that wants a training run to crash puts this folder first on ``PYTHONPATH`` (see
:func:`tests._crash_hook.crash_env`); Python then imports this module at start-up in the launching
``meshshard`` process and in every ``torchrun`` rank. With ``MESHSHARD_TEST_CRASH_AFTER_STEP=N``
set, it waits (through an import hook, so nothing is imported early) for
``meshshard.datasets.drivaerml_dataset`` and wraps ``DrivaerMLDataset.set_epoch``: the training loop
calls ``set_epoch(step)`` first thing in every step, so when step ``N + 1`` begins each rank dies
with ``os._exit(17)``: no cleanup, no exception, as a killed process. Step ``N`` is then in the log,
and, unless ``N`` is a checkpoint step, not in the checkpoint: the case a resume must handle.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_TARGET = "meshshard.datasets.drivaerml_dataset"
_STEP = int(os.environ.get("MESHSHARD_TEST_CRASH_AFTER_STEP", "0"))


def _patch(module) -> None:
    cls = module.DrivaerMLDataset
    set_epoch = cls.set_epoch

    def crashing_set_epoch(self, epoch: int) -> None:
        if epoch == _STEP + 1:
            os._exit(17)
        set_epoch(self, epoch)

    cls.set_epoch = crashing_set_epoch


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if _STEP > 0:
    sys.meta_path.insert(0, _Finder())
