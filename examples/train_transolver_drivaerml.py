"""Domain-parallel training of a Transolver surrogate on DrivaerML surfaces, written out in full.

The loop below is what ``meshshard train`` runs (:func:`meshshard.training.train`, with checkpoints,
resume and evaluation), reduced to the essentials so it can be copied into your own code:

    meshshard preprocess DATA STORE --parts 1 2
    torchrun --standalone --nproc-per-node 2 examples/train_transolver_drivaerml.py STORE --steps 100

Each rank reads only its shard of every sample (no communication), the model is an ordinary
``nn.Module``, the loss is the global mean over all points (one all-reduce), and
``sync_gradients`` makes every rank's parameter gradients the single-process ones.
"""

from __future__ import annotations

import argparse

import torch

import meshshard as ms
from meshshard.datasets import DrivaerMLDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=2e-3)
    args = parser.parse_args()

    mesh = ms.init_mesh()  # gloo on CPU, NCCL on CUDA; one rank per process
    fields = ["normals", "pMeanTrim", "wallShearStressMeanTrim"]
    ds = DrivaerMLDataset(args.store, split="train", fields=fields, mesh=mesh, normalize=True)
    pos_mean, pos_std = ds.stats["pos"]

    torch.manual_seed(0)  # the same initial weights on every rank
    model = ms.nn.Transolver(in_dim=6, out_dim=4, n_hidden=64, n_layers=3, n_head=4, slice_num=16)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    for step in range(1, args.steps + 1):
        s = ds[(step - 1) % len(ds)]  # this rank's shard, as ShardTensors
        x = torch.cat([(s["pos"] - pos_mean) / pos_std, s["normals"]], dim=-1)
        target = torch.cat([s["pMeanTrim"].unsqueeze(-1), s["wallShearStressMeanTrim"]], dim=-1)
        loss = ((model(x) - target) ** 2).mean()  # global mean over every rank's points
        opt.zero_grad()
        loss.backward()
        ms.nn.sync_gradients(model, mesh)
        opt.step()
        if mesh.get_rank() == 0 and (step == 1 or step % 10 == 0):
            print(f"step {step:4d}  loss {loss.item():.5f}  points on rank 0: {x.shape[0]} of {x.global_shape[0]}")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
