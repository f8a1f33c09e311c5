"""The ``meshshard`` command: ``demo``, ``partition``, ``preprocess``, ``train``, ``evaluate``, ``plan``.

User mistakes end with a one-line message on stderr and exit code 2, never a traceback; a command
that started and failed (a crashed training, runs that could not be processed) exits with 1.

Only the standard library is imported to build the parser, so ``meshshard --help`` and every
``meshshard COMMAND --help`` answer without importing torch, VTK or numpy; each command imports
what it needs when it runs.

Exit of a ``torchrun`` rank: after the command returned (or raised, once the traceback is printed and
the failure reported to the other ranks), a rank leaves with ``os._exit`` instead of a normal
interpreter shutdown. A 2-rank ``train`` on a heavily loaded machine died at exit with SIGABRT,
"terminate called without an active exception": ``std::terminate`` with no C++ exception, which at
exit means a native thread was unwound through a ``noexcept`` frame (a thread that takes the GIL
while the interpreter finalizes is ended with ``pthread_exit``) or a joinable ``std::thread`` was
destroyed by static destructors. The gloo backend's threads are such native threads, and they
outlive ``destroy_process_group`` (checked: its two worker threads and its TCP loop thread are
still running at ``atexit`` time, as references to the group remain); each worker keeps its last
collective (``workInProgress_``), with tensors that have Python objects, until it is scheduled
again, which a starved CPU delays into the finalization window.
A rank has nothing left to do at that point (its files are written and closed, stdout and stderr
are flushed), so it skips finalization and static destructors altogether, and the race with them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ._apps import RunFailed, UsageError

__all__ = ["main", "build_parser", "console_main", "UsageError", "RunFailed"]

METHODS = ("rcb", "morton", "hilbert")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer (got {value})")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number (got {text!r})") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number (got {text})")
    return value


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default (``%(default)s``) unless the help text already names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        if "default" in text or unset or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (Transolver)")
    g.add_argument("--n-hidden", type=_positive_int, default=64, help="width C")
    g.add_argument("--n-layers", type=_positive_int, default=3, help="blocks L")
    g.add_argument("--n-head", type=_positive_int, default=4, help="attention heads H (must divide --n-hidden)")
    g.add_argument("--slice-num", type=_positive_int, default=16, help="physics-attention slices M")
    g.add_argument("--mlp-ratio", type=_positive_int, default=2, help="MLP width ratio")


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", help="a store written by 'meshshard preprocess'")
    p.add_argument("--out", required=True, help="folder for checkpoint.pt, log.jsonl, train_summary.json")
    p.add_argument("--nproc", type=_positive_int, default=1, help="ranks to launch with torchrun")
    p.add_argument("--dp", type=_positive_int, default=1, help="data-parallel groups (a 2-D mesh when > 1)")
    p.add_argument("--steps", type=_positive_int, default=200, help="optimiser steps, one sample per step")
    p.add_argument("--lr", type=_positive_float, default=2e-3, help="AdamW learning rate (cosine decay to 5%%)")
    p.add_argument("--num-points", type=_positive_int, default=None, help="random subsample of every sample per step")
    p.add_argument("--checkpoint-every", type=_positive_int, default=50, help="steps between checkpoints")
    p.add_argument("--log-every", type=_positive_int, default=10, help="steps between printed loss lines")
    p.add_argument("--seed", type=int, default=0, help="seed of the model initialisation and of the sample order")
    p.add_argument("--grad-checkpoint", action="store_true", help="recompute blocks in backward (less memory)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--model", dest="arch", choices=("transolver", "transolver++", "meshgraphnet"),
                   default="transolver",
                   help="surrogate: Transolver (default), Transolver++ (adaptive temperature, Gumbel-softmax slices) "
                        "or MeshGraphNet (kNN graph, --n-layers blocks of width --n-hidden)")
    p.add_argument("--knn", dest="knn_k", metavar="K", type=_positive_int, default=6,
                   help="meshgraphnet: neighbours per point")
    _add_model_args(p)


def _under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def _relaunch(args: argparse.Namespace) -> int | None:
    """Run this command again under torchrun on ``--nproc`` ranks, unless already a rank."""
    if args.nproc == 1 or _under_torchrun():
        return None
    from ._apps.launch import torchrun

    argv = list(sys.argv[1:] if args.argv is None else args.argv)
    kept, skip = [], False
    for a in argv:  # torchrun's own parser would take --nproc for --nproc-per-node
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            kept.append(a)
    code = torchrun(args.nproc, kept)
    if code != 0:
        raise RunFailed(f"meshshard {args.command}: {args.nproc} ranks failed (exit code {code}); see above")
    return code


def _ranks(args: argparse.Namespace) -> int:
    """Ranks this command runs on: ``--nproc``, or the torchrun world when this process is a rank."""
    return int(os.environ["WORLD_SIZE"]) if _under_torchrun() else args.nproc


def _load_store_meta(command: str, store: str) -> dict[str, Any]:
    if not os.path.isdir(store):
        raise UsageError(f"meshshard {command}: store not found: {store} (write one with 'meshshard preprocess')")
    path = os.path.join(store, "meta.json")
    if not os.path.isfile(path):
        raise UsageError(f"meshshard {command}: {store} is not a store (no meta.json); run 'meshshard preprocess'")
    try:
        with open(path) as f:
            meta = json.load(f)
        meta["order_of"]  # noqa: B018  (present in every store format)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"meshshard {command}: cannot read {path} ({type(exc).__name__}: {exc})") from None
    return meta


def _check_parts(command: str, store: str, meta: dict[str, Any], ranks: int, dp: int) -> None:
    """The store must serve the per-sample part count ``ranks / dp``: checked before any rank starts."""
    if ranks % dp:
        raise UsageError(f"meshshard {command}: --dp {dp} must divide the number of ranks ({ranks})")
    parts = ranks // dp
    served = sorted(int(p) for p in meta["order_of"])
    if str(parts) not in meta["order_of"]:
        how = f"{ranks} ranks" + (f" / --dp {dp}" if dp > 1 else "")
        raise UsageError(
            f"meshshard {command}: the store {store} has no partition for P={parts} ({how}); it serves P in "
            f"{served}: preprocess again with --parts {' '.join(str(p) for p in sorted({*served, parts}))}, "
            f"or choose --nproc so that --nproc / --dp is one of {served}"
        )


def _check_out_folder(command: str, out: str) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"meshshard {command}: --out must be a folder, but {out} is a file")


def _run_train(args: argparse.Namespace) -> int:
    meta = _load_store_meta("train", args.store)
    _check_parts("train", args.store, meta, _ranks(args), args.dp)
    if not meta.get("splits", {}).get("train"):
        raise UsageError(f"meshshard train: the store {args.store} has no training runs")
    _check_out_folder("train", args.out)
    if args.arch != "meshgraphnet" and args.n_hidden % args.n_head:
        raise UsageError(f"meshshard train: --n-hidden ({args.n_hidden}) must be divisible by --n-head ({args.n_head})")
    code = _relaunch(args)
    if code is not None:
        return code
    from ._apps.train import TrainConfig, train

    cfg = TrainConfig(
        store=args.store,
        out=args.out,
        steps=args.steps,
        lr=args.lr,
        n_hidden=args.n_hidden,
        n_layers=args.n_layers,
        n_head=args.n_head,
        slice_num=args.slice_num,
        mlp_ratio=args.mlp_ratio,
        num_points=args.num_points,
        checkpoint_every=args.checkpoint_every,
        log_every=args.log_every,
        seed=args.seed,
        dp=args.dp,
        grad_checkpoint=args.grad_checkpoint,
        resume=args.resume,
        arch=args.arch,
        knn_k=args.knn_k,
    )
    train(cfg)
    return 0


def _check_checkpoint(path: str) -> None:
    if not os.path.exists(path):
        raise UsageError(f"meshshard evaluate: checkpoint not found: {path}")
    if not os.path.isfile(path):
        raise UsageError(f"meshshard evaluate: CHECKPOINT must be a file (got the folder {path})")
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # pickle, zip and torch errors all mean "not a checkpoint"
        raise UsageError(
            f"meshshard evaluate: {path} is not a checkpoint written by 'meshshard train' "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None
    if not isinstance(ckpt, dict) or not {"model", "config"} <= set(ckpt):
        raise UsageError(f"meshshard evaluate: {path} is not a checkpoint written by 'meshshard train' "
                         "(no 'model' and 'config' entries)")


def _run_evaluate(args: argparse.Namespace) -> int:
    meta = _load_store_meta("evaluate", args.store)
    _check_parts("evaluate", args.store, meta, _ranks(args), 1)
    _check_checkpoint(args.checkpoint)
    code = _relaunch(args)
    if code is not None:
        return code
    from ._apps.train import evaluate

    summary = evaluate(args.store, args.checkpoint, split=args.split, out=args.json)
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        if not summary["runs"]:
            print(f"the store has no runs in the {args.split!r} split")
        print(f"{'run':>5} {'points':>8} {'relL2 p':>9} {'relL2 wss':>9} {'Cd pred':>8} {'Cd true':>8} {'Cd csv':>8}")
        for r in summary["runs"]:
            csv = f"{r['Cd_csv']:.4f}" if r["Cd_csv"] is not None else "-"
            print(
                f"{r['run']:>5} {r['num_points']:>8} {r['rel_l2']['pMeanTrim']:>9.4f} "
                f"{r['rel_l2']['wallShearStressMeanTrim']:>9.4f} {r['Cd_pred']:>8.4f} {r['Cd_true']:>8.4f} {csv:>8}"
            )
    return 0


def _run_plan(args: argparse.Namespace) -> int:
    if (args.points is None) == (args.data is None):
        raise UsageError("meshshard plan: give exactly one of --points N or --data FILE")
    if args.data is not None and os.path.isdir(args.data):
        raise UsageError(f"meshshard plan: --data must be a file, but {args.data} is a folder")
    if args.data is not None and not os.path.isfile(args.data):
        raise UsageError(f"meshshard plan: file not found: {args.data}")
    if args.json is not None:
        _check_out_file("plan", "--json", args.json)
    from ._apps.plan import plan, print_plan

    report = plan(
        num_points=args.points,
        data=args.data,
        parts=args.parts,
        method=args.method,
        neighbors=args.neighbors,
        radius=args.radius,
        n_hidden=args.n_hidden,
        n_layers=args.n_layers,
        n_head=args.n_head,
        slice_num=args.slice_num,
        mlp_ratio=args.mlp_ratio,
        seed=args.seed,
        kind=args.kind,
        sample=args.sample,
        progress=not args.quiet,
    )
    print_plan(report)
    if args.json:
        from ._atomic import atomic_write

        atomic_write(args.json, lambda f: json.dump(report, f, indent=1))
    return 0


def _check_out_file(command: str, option: str, path: str) -> None:
    if os.path.isdir(path):
        raise UsageError(f"meshshard {command}: {option} must be a file name (got the folder {path})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"meshshard {command}: {option}: folder {folder} does not exist")


def _run_demo(args: argparse.Namespace) -> int:
    _check_out_folder("demo", args.out)
    from ._apps.demo import demo

    demo(
        out=args.out,
        nproc=args.nproc,
        runs=args.runs,
        surface_cells=args.surface_cells,
        steps=args.steps,
        single=not args.no_single,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``meshshard`` argument parser (standard library only: building it imports nothing heavy)."""
    parser = argparse.ArgumentParser(
        prog="meshshard",
        description="Domain parallelism for point clouds and meshes: partition, preprocess, train, plan.",
        epilog="Run 'meshshard COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"meshshard {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "demo",
        help="synthesise DrivaerML-like runs, train a sharded Transolver on N CPU ranks, compare with 1 process",
        description=(
            "The main job on embedded synthetic data: synthesise runs, preprocess them, train the sharded "
            "Transolver on --nproc ranks (torchrun, gloo), evaluate, write partition VTK files and a PNG, and "
            "compare with the same training in one process."
        ),
        formatter_class=_Formatter,
    )
    p.add_argument("--out", default="demo_out", help="output folder")
    p.add_argument("--nproc", type=_positive_int, default=2, help="ranks")
    p.add_argument("--runs", type=_positive_int, default=6, help="synthetic runs (at least 3: train, val, test)")
    p.add_argument("--surface-cells", type=_positive_int, default=8000, help="surface cells per run")
    p.add_argument("--steps", type=_positive_int, default=150, help="training steps")
    p.add_argument("--no-single", action="store_true", help="skip the single-process comparison")
    p.set_defaults(func=_run_demo)

    from .partition._cli import register as register_partition

    register_partition(sub, formatter_class=_Formatter)
    from .datasets._cli import register as register_preprocess

    register_preprocess(sub, formatter_class=_Formatter)

    p = sub.add_parser(
        "train",
        help="train the Transolver surrogate on a store (domain-parallel with --nproc > 1)",
        description=(
            "Domain-parallel training of a Transolver on surface pressure and wall shear stress. With --nproc N "
            "it relaunches itself under torchrun (gloo on CPU, NCCL on CUDA); --dp D makes a 2-D mesh. The store "
            "must be partitioned for P = N / D (meshshard preprocess --parts P). A progress bar shows on a "
            "terminal; loss lines every --log-every steps."
        ),
        formatter_class=_Formatter,
    )
    _train_args(p)
    p.set_defaults(func=_run_train)

    p = sub.add_parser(
        "evaluate",
        help="relative L2 per field and Cd/Cl of a checkpoint on a split",
        description=(
            "Evaluate a checkpoint written by 'meshshard train' on every run of a split of the store: relative "
            "L2 error of pressure and wall shear stress, and the drag coefficient from the predicted fields, "
            "from the stored fields and from the raw data's force_mom_i.csv (when its folder is still there)."
        ),
        formatter_class=_Formatter,
    )
    p.add_argument("store", metavar="STORE", help="a store written by 'meshshard preprocess'")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint.pt written by 'meshshard train'")
    p.add_argument("--split", choices=("train", "val", "test", "all"), default="test", help="runs to evaluate")
    p.add_argument("--nproc", type=_positive_int, default=1, help="ranks to launch with torchrun")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.set_defaults(func=_run_evaluate)

    p = sub.add_parser(
        "plan",
        help="capacity planning: per-rank points, ghosts, halo bytes and activation memory for P ranks",
        description=(
            "Partition a cloud and build every rank's halo plan in ONE process, for any number of parts, and "
            "estimate per-rank activation memory of a Transolver: plan clusters you do not have."
        ),
        formatter_class=_Formatter,
    )
    p.add_argument("--points", type=_positive_int, default=None, help="synthetic car-surface-like cloud of N points")
    p.add_argument("--data", default=None, help="a .npy (N, 3) file or a mesh (.vtp/.vtu/.vtk/.stl/.ply/.obj; cell "
                   "centres)")
    p.add_argument("--parts", type=_positive_int, required=True, help="ranks P")
    p.add_argument("--method", choices=METHODS, default="rcb", help="partitioner")
    p.add_argument("--neighbors", type=_positive_int, default=32, help="size the ball radius for about k neighbours")
    p.add_argument("--radius", type=_positive_float, default=None, help="ball radius (overrides --neighbors)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic cloud")
    p.add_argument("--kind", choices=("surface", "volume"), default="surface", help="synthetic cloud for --points")
    p.add_argument(
        "--sample",
        type=_positive_int,
        default=1_000_000,
        help="above this many points, plan exactly on samples of this size and a quarter of it and scale the "
        "ghosts to N by a fitted (N/P)^(1-1/d) model, with an error bound",
    )
    p.add_argument("--json", default=None, help="also write the report to this JSON file")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    _add_model_args(p)
    p.set_defaults(func=_run_plan)
    return parser


def _version() -> str:
    from . import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return its exit code.

    A user mistake prints one line on stderr and raises ``SystemExit(2)`` (as argparse does); a
    command that fails after starting prints one line and raises ``SystemExit(1)``.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else None
    try:
        code = int(args.func(args) or 0)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr, flush=True)
            raise SystemExit(getattr(exc, "exit_code", 2)) from None
        raise
    # A rank that raised keeps its process group: the excepthook still reports it to the others.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    return code


def console_main() -> NoReturn:
    """Entry point of the ``meshshard`` script and of ``python -m meshshard.cli`` (see the module docstring)."""
    rank = _under_torchrun()
    try:
        code: Any = main()
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        if not rank:
            raise
        sys.excepthook(*sys.exc_info())  # prints the traceback; meshshard's hook also tells the other ranks
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    if rank:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console_main()
