"""Domain-parallel training of a plain-PyTorch PointNet surrogate on DrivaerML surfaces.

The model (:class:`meshshard.nn.PointNetSurrogate`) is ordinary PyTorch — ``Conv1d`` with kernel 1,
``BatchNorm1d``, ``ReLU``, a global max over the points, the global feature repeated to every point,
``F.mse_loss`` — with no meshshard code in it. Fed ShardTensors sharded along the points, it trains
over all ranks' points: BatchNorm statistics, the max pooling and the loss are all-reduced, and after
``sync_gradients`` every rank takes the single-process step.

    meshshard preprocess DATA STORE --parts 1 2 3
    torchrun --standalone --nproc-per-node 1 examples/train_pointnet_drivaerml.py STORE --steps 5
    torchrun --standalone --nproc-per-node 3 examples/train_pointnet_drivaerml.py STORE --steps 5

PointNet is invariant to the order of the points, so the three runs print the same losses and the same
parameter checksum (to float32 round-off) although each store partition orders the points differently.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import meshshard as ms
from meshshard.datasets import DrivaerMLDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    mesh = ms.init_mesh()  # gloo on CPU, NCCL on CUDA; one rank per process
    fields = ["normals", "pMeanTrim", "wallShearStressMeanTrim"]
    ds = DrivaerMLDataset(args.store, split="train", fields=fields, mesh=mesh, normalize=True)
    pos_mean, pos_std = ds.stats["pos"]

    torch.manual_seed(0)  # the same initial weights on every rank
    model = ms.nn.PointNetSurrogate(in_dim=6, out_dim=4, width=64, global_dim=128)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for step in range(1, args.steps + 1):
        s = ds[(step - 1) % len(ds)]  # this rank's shard, as ShardTensors (N, ...)
        x = torch.cat([(s["pos"] - pos_mean) / pos_std, s["normals"]], dim=-1)  # (N, 6)
        target = torch.cat([s["pMeanTrim"].unsqueeze(-1), s["wallShearStressMeanTrim"]], dim=-1)  # (N, 4)
        x, target = x.transpose(0, 1).unsqueeze(0), target.transpose(0, 1).unsqueeze(0)  # (1, C, N)
        loss = F.mse_loss(model(x), target)  # the global mean over every rank's points
        opt.zero_grad()
        loss.backward()
        ms.nn.sync_gradients(model, mesh)
        opt.step()
        if mesh.get_rank() == 0:
            print(f"step {step:4d}  loss {loss.item():.7f}  points on rank 0: {x.local_shape[2]} of {x.shape[2]}")
    if mesh.get_rank() == 0:
        checksum = sum(float(p.detach().double().abs().sum()) for p in model.parameters())
        print(f"parameter checksum {checksum:.7f}")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
