"""Test files mirror the modules they test: ``tests/<path>/test_<name>.py`` for ``meshshard/<path>/[_]<name>.py``.

A directory or module name in ``tests/`` drops the leading underscore of a private one
(``meshshard/tensor/_rules/_loss.py`` -> ``tests/tensor/rules/test_loss.py``); a package is tested by
``test_<package>.py`` beside its directory. Catalogues that cut across the package are listed in
:data:`CROSS_CUTTING` with the reason they stand apart. The check runs both ways: every module has its
test file, or is listed in :data:`TESTED_ELSEWHERE` with the tests that cover it.
"""

from __future__ import annotations

from pathlib import Path

import meshshard

PACKAGE = Path(meshshard.__file__).parent
TESTS = Path(__file__).parent
#: Application folders beside the package whose tests mirror them the same way (``tests/tools/test_x.py``).
APPLICATIONS = {"tools": PACKAGE.parent / "tools"}

#: Test files that check the package as a whole rather than one module, and why.
CROSS_CUTTING = {
    "test_bad_input.py": "every public entry point (from the modules' __all__) fed bad input",
    "test_properties.py": "hypothesis properties of ShardTensor and neighbour search across world sizes",
    "test_layers.py": "the module-level import graph of the whole package",
    "test_function_size.py": "the length of every function of the package",
    "test_readme.py": "runs every Python block of README.md",
    "test_first_hour.py": "a new user's first hour: install, CLI, messages, examples",
    "test_test_layout.py": "this check",
    "test_example_pointnet.py": "examples/train_pointnet_drivaerml.py, a complete script, against one process",
    "test_example_transolver.py": "examples/train_transolver_drivaerml.py, a complete script",
    "tensor/test_opinfo_sweep.py": "torch's OpInfo database against every sharding rule",
    "tensor/test_findings.py": "the tensor core's past silent wrong answers, one regression test each",
    "tensor/rules/test_adaptive.py": "adaptive pools of tensor/_rules/_grid.py (test_grid.py holds the other grid ops)",
    "test_boundary.py": "the library/applications boundary: no exit outside meshshard/cli, errors are Exceptions",
    "test_doctests.py": "runs every >>> example in the package's docstrings",
    "test_conftest.py": "tests/conftest.py: which tests share a pytest-xdist worker",
    "nn/test_compile_graph.py": "torch.compile of the graph path across modules: nn/domain_parallel.py, ops/graph.py",
}

#: Modules (relative to ``meshshard/``) without a test file of their own, and the tests that cover them.
TESTED_ELSEWHERE = {
    "__init__.py": "re-exports only: test_lazy.py (its lazy names), test_readme.py",
    "nn/__init__.py": "re-exports only: test_lazy.py and the tests of nn/'s modules",
    "io/__init__.py": "re-exports only: the tests of io/'s modules",
    "ops/__init__.py": "re-exports only: the tests of ops/'s modules",
    "datasets/__init__.py": "re-exports only: test_lazy.py and the tests of datasets/'s modules",
    "partition/__init__.py": "re-exports only: test_lazy.py and the tests of partition/'s modules",
    "tensor/__init__.py": "re-exports only: tensor/test_tensor.py, tensor/test_rules.py",
    "_config.py": "TransolverConfig: test_training.py, cli/test_train.py, nn/test_reference.py",
    "_records.py": "the Record mixin of typed reports: test_planning.py (a plan reads like a dict)",
    "_spawn.py": "the main-guard check for spawned workers: test_first_hour.py",
    "errors.py": "the error classes: test_boundary.py (all are Exceptions), test_bad_input.py, test_cli.py",
    "cli/__main__.py": "`python -m meshshard.cli` (how torchrun starts each rank): test_cli.py, cli/test_train.py",
    "cli/_common.py": "the parser pieces shared by the subcommands: cli/test_train.py, test_cli.py",
    "cli/_inputs.py": "path and store checks before any rank starts: cli/test_evaluate.py, cli/test_train.py",
    "cli/_launch.py": "torchrun re-launch of --nproc N: cli/test_train.py, test_readme.py",
    "kernels/_common.py": "helpers shared by the kernels (pair distances, row selection): kernels/test_grid.py",
    "kernels/_fused_cuda.py": "the fused kernel's CUDA build: kernels/test_fused.py (CUDA only), tools/gpu_check.py",
    "kernels/_numba.py": "the fused kernel's CPU (numba) build: kernels/test_fused.py",
    "kernels/_scipy.py": "the cKDTree backend: ops/test_neighbors.py (every backend against the reference)",
    "kernels/_torch_cluster.py": "the torch-cluster peer backend: ops/test_neighbors.py, tensor/rules/test_cluster.py",
    "nn/meshgraphnet.py": "MeshGraphNet: nn/test_domain_parallel.py, ops/test_graph.py, cli/test_train.py",
    "ops/metrics.py": "relative_l2_error: tensor/rules/test_loss.py, test_bad_input.py",
    "partition/_rcb.py": "RCB: partition/test_core.py, test_properties.py",
    "partition/_validate.py": "the partitioners' argument checks: partition/test_core.py, test_bad_input.py",
    "tensor/_rules/_common.py": "helpers of the rules: tensor/test_rules.py and every tensor/rules/ test",
    "tensor/_rules/_index.py": "indexing rules: tensor/test_rules.py, tensor/rules/test_select.py, the OpInfo sweep",
    "tensor/_rules/_local.py": "local (row-wise) rules: tensor/test_rules.py, tensor/test_opinfo_sweep.py",
    "tensor/_rules/_pointwise.py": "pointwise rules: tensor/test_rules.py, tensor/test_opinfo_sweep.py",
    "tensor/_rules/_reduce.py": "reductions: tensor/test_rules.py, tensor/test_opinfo_sweep.py, test_properties.py",
    "tensor/_rules/_shape.py": "shape ops: tensor/test_rules.py, tensor/test_opinfo_sweep.py, tensor/test_spec.py",
    "testing/_pool.py": "WorkerPool, DistributedError: test_testing.py (run_distributed is its front end)",
    "testing/curator.py": "a fake PhysicsNeMo-Curator output: datasets/test_curator.py, cli/test_preprocess.py",
}


def _module_for(test: Path) -> Path | None:
    """The module (or package ``__init__``) that ``test`` mirrors, or ``None``."""
    rel = test.relative_to(TESTS)
    folder, parts = PACKAGE, rel.parts[:-1]
    if parts and parts[0] in APPLICATIONS:
        folder, parts = APPLICATIONS[parts[0]], parts[1:]
    for part in parts:
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


def test_every_module_has_its_test_file_or_a_listed_reason():
    mirrored = {_module_for(p) for p in TESTS.rglob("test_*.py")}
    modules = sorted(p for p in PACKAGE.rglob("*.py"))
    assert len(modules) > 20
    names = [str(m.relative_to(PACKAGE)) for m in modules if m not in mirrored]
    untested = [name for name in names if name not in TESTED_ELSEWHERE]
    assert not untested, f"modules without a test file (add one, or list them in TESTED_ELSEWHERE): {untested}"
    # a listed module that has gained its own test file, or no longer exists, leaves the list
    stale = [name for name in TESTED_ELSEWHERE if not (PACKAGE / name).is_file() or PACKAGE / name in mirrored]
    assert not stale, f"TESTED_ELSEWHERE entries that are gone or now have their own test file: {stale}"


def test_listed_catalogues_exist():
    missing = [name for name in CROSS_CUTTING if not (TESTS / name).is_file()]
    assert not missing, missing


def test_the_mapping_reads_private_names():
    assert _module_for(TESTS / "tensor" / "rules" / "test_loss.py") == PACKAGE / "tensor" / "_rules" / "_loss.py"
    assert _module_for(TESTS / "test_halo.py") == PACKAGE / "halo.py"
    assert _module_for(TESTS / "tensor" / "test_rules.py") == PACKAGE / "tensor" / "_rules" / "__init__.py"
    assert _module_for(TESTS / "test_nothing_here.py") is None
    assert _module_for(TESTS / "tools" / "test_gpu_check.py") == APPLICATIONS["tools"] / "gpu_check.py"
