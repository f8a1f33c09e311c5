"""The ``meshshard`` command: ``demo``, ``partition``, ``preprocess``, ``train``, ``evaluate``, ``plan``.

User mistakes end with a one-line message and exit code 2 (``SystemExit``), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer (got {value})")
    return value


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (Transolver)")
    g.add_argument("--n-hidden", type=_positive_int, default=64, help="width C (default 64)")
    g.add_argument("--n-layers", type=_positive_int, default=3, help="blocks L (default 3)")
    g.add_argument("--n-head", type=_positive_int, default=4, help="heads H (default 4)")
    g.add_argument("--slice-num", type=_positive_int, default=16, help="slices M (default 16)")
    g.add_argument("--mlp-ratio", type=_positive_int, default=2, help="MLP width ratio (default 2)")


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", help="a store written by 'meshshard preprocess'")
    p.add_argument("--out", required=True, help="folder for checkpoint.pt, log.jsonl, train_summary.json")
    p.add_argument("--nproc", type=_positive_int, default=1, help="ranks to launch with torchrun (default 1)")
    p.add_argument("--dp", type=_positive_int, default=1, help="data-parallel groups (2-D mesh when > 1)")
    p.add_argument("--steps", type=_positive_int, default=200)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--num-points", type=_positive_int, default=None, help="random subsample per step (all ranks)")
    p.add_argument("--checkpoint-every", type=_positive_int, default=50)
    p.add_argument("--log-every", type=_positive_int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grad-checkpoint", action="store_true", help="recompute blocks in backward")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    _add_model_args(p)


def _relaunch(args: argparse.Namespace) -> int | None:
    """Run this command again under torchrun on ``--nproc`` ranks, unless already a rank."""
    from ._apps.launch import torchrun, under_torchrun

    if args.nproc == 1 or under_torchrun():
        return None
    argv = list(sys.argv[1:] if args.argv is None else args.argv)
    kept, skip = [], False
    for a in argv:  # torchrun's own parser would take --nproc for --nproc-per-node
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            kept.append(a)
    return torchrun(args.nproc, kept)


def _run_train(args: argparse.Namespace) -> int:
    code = _relaunch(args)
    if code is not None:
        return code
    from ._apps.train import TrainConfig, train

    if not os.path.isfile(os.path.join(args.store, "meta.json")):
        raise SystemExit(f"meshshard train: {args.store} is not a store (no meta.json); run 'meshshard preprocess'")
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
    )
    if args.n_hidden % args.n_head:
        raise SystemExit(f"meshshard train: --n-hidden ({args.n_hidden}) must be divisible by --n-head ({args.n_head})")
    train(cfg)
    return 0


def _run_evaluate(args: argparse.Namespace) -> int:
    code = _relaunch(args)
    if code is not None:
        return code
    from ._apps.train import evaluate

    if not os.path.isfile(args.checkpoint):
        raise SystemExit(f"meshshard evaluate: checkpoint not found: {args.checkpoint}")
    summary = evaluate(args.store, args.checkpoint, split=args.split, out=args.json)
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"{'run':>5} {'points':>8} {'relL2 p':>9} {'relL2 wss':>9} {'Cd pred':>8} {'Cd true':>8} {'Cd csv':>8}")
        for r in summary["runs"]:
            csv = f"{r['Cd_csv']:.4f}" if r["Cd_csv"] is not None else "-"
            print(
                f"{r['run']:>5} {r['num_points']:>8} {r['rel_l2']['pMeanTrim']:>9.4f} "
                f"{r['rel_l2']['wallShearStressMeanTrim']:>9.4f} {r['Cd_pred']:>8.4f} {r['Cd_true']:>8.4f} {csv:>8}"
            )
    return 0


def _run_plan(args: argparse.Namespace) -> int:
    from ._apps.plan import plan, print_plan

    if (args.points is None) == (args.data is None):
        raise SystemExit("meshshard plan: give exactly one of --points N or --data FILE")
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
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _run_demo(args: argparse.Namespace) -> int:
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
    parser = argparse.ArgumentParser(
        prog="meshshard",
        description="Domain parallelism for point clouds and meshes: partition, preprocess, train, plan.",
    )
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
    )
    p.add_argument("--out", default="demo_out", help="output folder (default demo_out)")
    p.add_argument("--nproc", type=_positive_int, default=2, help="ranks (default 2)")
    p.add_argument("--runs", type=_positive_int, default=6, help="synthetic runs (default 6)")
    p.add_argument("--surface-cells", type=_positive_int, default=8000, help="cells per run (default 8000)")
    p.add_argument("--steps", type=_positive_int, default=150, help="training steps (default 150)")
    p.add_argument("--no-single", action="store_true", help="skip the single-process comparison")
    p.set_defaults(func=_run_demo)

    from .partition._cli import register as register_partition

    register_partition(sub)
    from .datasets._cli import register as register_preprocess

    register_preprocess(sub)

    p = sub.add_parser(
        "train",
        help="train the Transolver surrogate on a store (domain-parallel with --nproc > 1)",
        description=(
            "Domain-parallel training of a Transolver on surface pressure and wall shear stress. With --nproc N "
            "it relaunches itself under torchrun (gloo on CPU, NCCL on CUDA); --dp D makes a 2-D mesh."
        ),
    )
    _train_args(p)
    p.set_defaults(func=_run_train)

    p = sub.add_parser("evaluate", help="relative L2 per field and Cd/Cl of a checkpoint on a split")
    p.add_argument("store", metavar="STORE")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint.pt written by 'meshshard train'")
    p.add_argument("--split", choices=("train", "val", "test", "all"), default="test")
    p.add_argument("--nproc", type=_positive_int, default=1, help="ranks to launch with torchrun (default 1)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.set_defaults(func=_run_evaluate)

    p = sub.add_parser(
        "plan",
        help="capacity planning: per-rank points, ghosts, halo bytes and activation memory for P ranks",
        description=(
            "Partition a cloud and build every rank's halo plan in ONE process, for any number of parts, and "
            "estimate per-rank activation memory of a Transolver: plan clusters you do not have."
        ),
    )
    p.add_argument("--points", type=_positive_int, default=None, help="synthetic car-surface-like cloud of N points")
    p.add_argument("--data", default=None, help="a .npy (N,3) file or a mesh (.vtp/.vtu/.stl; cell centres)")
    p.add_argument("--parts", type=_positive_int, required=True, help="ranks P")
    p.add_argument("--method", choices=("rcb", "morton", "hilbert"), default="rcb")
    p.add_argument("--neighbors", type=_positive_int, default=32, help="size the radius for ~k neighbours")
    p.add_argument("--radius", type=float, default=None, help="ball radius (overrides --neighbors)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kind", choices=("surface", "volume"), default="surface", help="synthetic cloud for --points")
    p.add_argument(
        "--sample",
        type=_positive_int,
        default=1_000_000,
        help="above this many points, plan exactly on samples of this size and a quarter of it and scale the "
        "ghosts to N by a fitted (N/P)^(1-1/d) model, with an error bound (default 1000000)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", default=None, help="also write the report to this JSON file")
    _add_model_args(p)
    p.set_defaults(func=_run_plan)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else None
    try:
        return int(args.func(args) or 0)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()  # gloo's threads must not outlive the interpreter's teardown


if __name__ == "__main__":
    sys.exit(main())
