"""``meshshard train``: domain-parallel training on a store (:func:`meshshard.training.train`)."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import UsageError
from ._common import Formatter, add_command, add_model_args, model_config, positive_float, positive_int
from ._inputs import check_out_folder, check_parts, load_store_meta
from ._launch import ranks, relaunch, under_torchrun

__all__ = ["register", "run"]


def register(subparsers: Any, formatter_class: type[argparse.HelpFormatter] = Formatter) -> None:
    """Add the ``train`` subcommand to an ``argparse`` subparsers object."""
    p = add_command(
        subparsers, "train", run, formatter_class,
        summary="train the Transolver surrogate on a store (domain-parallel with --nproc > 1)",
        description=(
            "Domain-parallel training of a Transolver on surface pressure and wall shear stress. With --nproc N "
            "it relaunches itself under torchrun (gloo on CPU, NCCL on CUDA); --dp D makes a 2-D mesh. The store "
            "must be partitioned for P = N / D (meshshard preprocess --parts P). A progress bar shows on a "
            "terminal; loss lines every --log-every steps."
        ),
    )
    p.add_argument("store", metavar="STORE", help="a store written by 'meshshard preprocess'")
    p.add_argument("--out", required=True, help="folder for checkpoint.pt, log.jsonl, train_summary.json")
    p.add_argument("--nproc", type=positive_int, default=1, help="ranks to launch with torchrun")
    p.add_argument("--dp", type=positive_int, default=1, help="data-parallel groups (a 2-D mesh when > 1)")
    p.add_argument("--steps", type=positive_int, default=200, help="optimiser steps, one sample per step")
    p.add_argument("--lr", type=positive_float, default=2e-3, help="AdamW learning rate (cosine decay to 5%%)")
    p.add_argument("--num-points", type=positive_int, default=None, help="random subsample of every sample per step")
    p.add_argument("--checkpoint-every", type=positive_int, default=50, help="steps between checkpoints")
    p.add_argument("--log-every", type=positive_int, default=10, help="steps between printed loss lines")
    p.add_argument("--seed", type=int, default=0, help="seed of the model initialisation and of the sample order")
    p.add_argument("--grad-checkpoint", action="store_true", help="recompute blocks in backward (less memory)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--model", dest="arch", choices=("transolver", "transolver++", "meshgraphnet"),
                   default="transolver",
                   help="surrogate: Transolver (default), Transolver++ (adaptive temperature, Gumbel-softmax slices) "
                        "or MeshGraphNet (kNN graph, --n-layers blocks of width --n-hidden)")
    p.add_argument("--knn", dest="knn_k", metavar="K", type=positive_int, default=6,
                   help="meshgraphnet: neighbours per point")
    add_model_args(p)


def run(args: argparse.Namespace) -> int:
    """Check the store and options (before any rank starts), relaunch under torchrun if asked, train."""
    meta = load_store_meta("train", args.store)
    check_parts("train", args.store, meta, ranks(args), args.dp)
    if not meta.get("splits", {}).get("train"):
        raise UsageError(f"meshshard train: the store {args.store} has no training runs")
    check_out_folder("train", args.out)
    # the Transolver options are consistent, before any rank starts (MeshGraphNet: width and depth only)
    transolver = None if args.arch == "meshgraphnet" else model_config("train", args)
    from ..errors import CheckpointError
    from ..training import MeshGraphNetConfig, TrainConfig, check_resume, train

    model = transolver or MeshGraphNetConfig(hidden=args.n_hidden, num_layers=args.n_layers)

    cfg = TrainConfig(
        store=args.store,
        out=args.out,
        steps=args.steps,
        lr=args.lr,
        model_config=model,
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
    try:
        if args.resume and not under_torchrun():
            check_resume(cfg)  # a checkpoint that cannot be resumed stops here, before any rank starts
        code = relaunch(args)
        if code is not None:
            return code
        train(cfg)
    except CheckpointError as exc:
        raise UsageError(f"meshshard train: --resume: {exc}") from None
    return 0
