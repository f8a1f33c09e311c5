"""Domain-parallel training and evaluation of a Transolver or MeshGraphNet surrogate on a DrivaerML store.

The loop behind ``meshshard train`` and ``meshshard evaluate``, public so that scripts can run it:
``train(TrainConfig(store, out, steps=..., n_hidden=...))`` and ``evaluate(store, checkpoint)``.

Run under ``torchrun`` (one process per rank; gloo on CPU, NCCL on CUDA) or as one process.
Every rank holds one shard of each sample (read from its contiguous slice of the store, no
communication), the model is replicated, the loss is the global mean over all points of the
sample (one all-reduce), and :func:`meshshard.nn.sync_gradients` sums the partial parameter
gradients, so P ranks follow the single-process trajectory to rounding.

Determinism and resume: the model is initialised from ``seed``; the sample of step ``s`` and its
subsample are pure functions of ``(seed, s)``, so no RNG state has to be carried. A checkpoint
(weights, optimiser, step, config, RNG states for completeness) is written atomically by rank 0
every ``checkpoint_every`` steps; ``resume=True`` continues at the next step and truncates the log
to the checkpoint, so no step is lost or repeated.
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ._atomic import atomic_write
from ._checks import check_positive_int
from .comm import all_gather_object, all_reduce, barrier, group_rank_and_size
from .datasets.synthetic import RHO, U_INF, integrate_forces
from .device_mesh import init_mesh
from .errors import UsageError
from .faults import install_excepthook
from .nn import Transolver, TransolverConfig, sync_gradients
from .tensor import ShardTensor

__all__ = ["TrainConfig", "train", "evaluate", "features", "TARGETS", "INPUTS"]

#: Surface inputs (normalised position, unit normal) and targets (DrivaerML names), in channel order.
INPUTS = ("pos", "normals")
TARGETS = ("pMeanTrim", "wallShearStressMeanTrim")
#: The models ``TrainConfig.arch`` names.
ARCHS = ("transolver", "transolver++", "meshgraphnet")
_TARGET_CHANNELS = {"pMeanTrim": slice(0, 1), "wallShearStressMeanTrim": slice(1, 4)}


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved in every checkpoint).

    The model's hyper-parameters (``n_hidden`` ... ``mlp_ratio``) default to
    :class:`~meshshard.nn.TransolverConfig`'s; :attr:`transolver` gathers them. MeshGraphNet uses
    ``n_hidden`` as its width and ``n_layers`` as its depth.
    """

    store: str
    out: str
    steps: int = 200
    lr: float = 2e-3
    weight_decay: float = 1e-4
    n_hidden: int = TransolverConfig.n_hidden
    n_layers: int = TransolverConfig.n_layers
    n_head: int = TransolverConfig.n_head
    slice_num: int = TransolverConfig.slice_num
    mlp_ratio: int = TransolverConfig.mlp_ratio
    num_points: int | None = None
    checkpoint_every: int = 50
    log_every: int = 10
    seed: int = 0
    dp: int = 1
    grad_checkpoint: bool = False
    resume: bool = False
    quiet: bool = False
    arch: str = "transolver"  # or "transolver++", "meshgraphnet"
    knn_k: int = 6

    def __post_init__(self) -> None:
        for name in ("store", "out"):
            value = getattr(self, name)
            if not isinstance(value, str | os.PathLike):
                raise TypeError(f"{name} must be a path (got {type(value).__name__})")
            setattr(self, name, os.fspath(value))
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS} (got {self.arch!r})")
        for name in ("steps", "checkpoint_every", "log_every", "dp", "knn_k"):
            check_positive_int(getattr(self, name), name)
        check_positive_int(self.num_points, "num_points", allow_none=True)
        if self.arch == "meshgraphnet":  # width and depth only
            check_positive_int(self.n_hidden, "n_hidden")
            check_positive_int(self.n_layers, "n_layers")
        else:
            self.transolver  # noqa: B018  (validates the model's hyper-parameters)
        if not _is_real(self.lr) or not 0 < self.lr < math.inf:
            raise ValueError(f"lr must be a positive finite number (got {self.lr!r})")
        if not _is_real(self.weight_decay) or not 0 <= self.weight_decay < math.inf:
            raise ValueError(f"weight_decay must be a non-negative finite number (got {self.weight_decay!r})")

    @property
    def transolver(self) -> TransolverConfig:
        """The model's hyper-parameters as one :class:`~meshshard.nn.TransolverConfig`."""
        return TransolverConfig(n_hidden=self.n_hidden, n_layers=self.n_layers, n_head=self.n_head,
                                slice_num=self.slice_num, mlp_ratio=self.mlp_ratio)

    def model(self) -> torch.nn.Module:
        torch.manual_seed(self.seed)
        if self.arch == "meshgraphnet":
            from .nn.meshgraphnet import MeshGraphNet  # torch-geometric: imported only when used

            return MeshGraphNet(6, 4, 4, hidden=self.n_hidden, num_layers=self.n_layers)
        return Transolver(
            in_dim=6,
            out_dim=4,
            **asdict(self.transolver),
            checkpoint=self.grad_checkpoint,
            variant="plus" if self.arch == "transolver++" else "plain",
            seed=self.seed,
        )


def features(sample: dict[str, torch.Tensor], stats: dict[str, tuple[torch.Tensor, torch.Tensor]]):
    """Model inputs ``(N, 6)`` and normalised targets ``(N, 4)`` of a (sharded or whole) sample.

    Inputs: position standardised with the store's training statistics, and the unit normal.
    Targets: ``pMeanTrim`` and ``wallShearStressMeanTrim`` as returned by a dataset built with
    ``normalize=True`` (standardised).
    """
    missing = [name for name in (*INPUTS, *TARGETS) if name not in sample]
    if missing or "pos" not in stats:
        raise ValueError(
            f"features needs a sample with {list(INPUTS + TARGETS)} and stats with 'pos' "
            f"(sample lacks {missing}; stats has {sorted(stats)})"
        )
    mean, std = stats["pos"]
    pos = (sample["pos"] - mean) / std
    x = torch.cat([pos, sample["normals"]], dim=-1)
    t = torch.cat([sample["pMeanTrim"].unsqueeze(-1), sample["wallShearStressMeanTrim"]], dim=-1)
    return x, t


def _predict(cfg: TrainConfig, model: torch.nn.Module, sample: dict, x, stats):
    """The model's output on one (sharded) sample.

    MeshGraphNet runs on the exact kNN graph of the surface points (``cfg.knn_k`` neighbours,
    self excluded), with edge inputs the relative standardised position and its length, through
    :class:`~meshshard.nn.DomainParallel` (one halo exchange per block).
    """
    if cfg.arch != "meshgraphnet":
        return model(x)
    from .nn import DomainParallel
    from .ops import ShardedGraph, knn

    pos = sample["pos"]
    graph = ShardedGraph.from_neighbors(pos, knn(pos, None, cfg.knn_k + 1))
    rel, _ = graph.edge_vectors()
    rel = rel / stats["pos"][1].reshape(1, -1).to(rel)
    runner = DomainParallel(model, graph)
    try:
        return runner(x, graph.edge_index, torch.cat([rel, rel.norm(dim=-1, keepdim=True)], -1))
    finally:
        runner.remove()


def _is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _atomic_save(obj: Any, path: Path) -> None:
    atomic_write(path, lambda f: torch.save(obj, f), "wb")


def _atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def _setup(dp: int):
    """``(mesh, dp_rank, dp_size)``; ``mesh`` is None single-process without a process group."""
    if not dist.is_initialized() and "RANK" not in os.environ:
        return None, 0, 1
    world = int(os.environ.get("WORLD_SIZE", "1")) if not dist.is_initialized() else dist.get_world_size()
    if dp < 1 or world % dp:
        raise UsageError(f"meshshard train: --dp {dp} must divide the number of ranks ({world})")
    mesh = init_mesh((dp, world // dp) if dp > 1 else None)
    dp_rank = mesh.get_local_rank(0) if dp > 1 else 0
    return mesh, dp_rank, dp


def _dataset(cfg: TrainConfig, split: str, mesh, num_points):
    from .datasets import DrivaerMLDataset

    return DrivaerMLDataset(
        cfg.store,
        split=split,
        kind="surface",
        fields=["normals", "areas", *TARGETS],
        mesh=mesh,
        num_points=num_points,
        seed=cfg.seed,
        normalize=True,
    )


def _relative_l2(y: torch.Tensor, t: torch.Tensor, ds) -> dict[str, float]:
    """Relative L2 error per target field, in physical units, over the whole (sharded) sample."""
    out = {}
    for name, ch in _TARGET_CHANNELS.items():
        yp = ds.denormalize(name, y[..., ch])
        tp = ds.denormalize(name, t[..., ch])
        err = ((yp - tp) ** 2).sum()
        ref = (tp**2).sum()
        out[name] = math.sqrt(float(err) / max(float(ref), 1e-30))
    return out


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train; return a summary (final loss, losses per step, per-rank points and peak memory)."""
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a meshshard.training.TrainConfig (got {type(cfg).__name__})")
    cfg = replace(cfg)  # runs TrainConfig's checks again: the fields may have been changed since construction
    mesh, dp_rank, dp = _setup(cfg.dp)
    if mesh is not None:
        install_excepthook()  # a rank that dies of an exception is named in the others' errors
    out = Path(cfg.out)
    if _is_main():
        out.mkdir(parents=True, exist_ok=True)
    ds = _dataset(cfg, "train", mesh, cfg.num_points)
    if len(ds) == 0:
        raise UsageError(f"meshshard train: the store {cfg.store} has no training runs")
    stats = ds.stats
    model = cfg.model()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.steps, eta_min=cfg.lr * 0.05)
    ckpt_path, log_path = out / "checkpoint.pt", out / "log.jsonl"
    start, log = 0, []
    if cfg.resume and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        start, log = ckpt["step"], ckpt["log"]
        torch.set_rng_state(ckpt["rng"])
        model.rng_step = start  # Transolver++'s Gumbel noise continues the run's sequence
    elif cfg.resume and not cfg.quiet and _is_main():
        print(f"no checkpoint in {out}: starting from step 0")
    if _is_main():
        # the log holds exactly the steps up to the checkpoint: none lost, none repeated
        _atomic_write_text(log_path, "".join(json.dumps(e) + "\n" for e in log))
    bar = _progress_bar(cfg, start)
    dp_group = mesh.get_group(0) if dp > 1 else None
    t0 = time.perf_counter()
    n_points = 0
    for step in range(start + 1, cfg.steps + 1):
        ds.set_epoch(step)
        index = ((step - 1) * dp + dp_rank) % len(ds)
        sample = ds[index]
        x, t = features(sample, stats)
        n_points = x.shape[0]
        model.train()
        y = _predict(cfg, model, sample, x, stats)
        loss = ((y - t) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if mesh is not None:
            sync_gradients(model, mesh)
        opt.step()
        sched.step()
        value = loss.detach().reshape(1).clone()
        if dp_group is not None:
            value = all_reduce(value, dp_group) / dp
        entry = {"step": step, "loss": float(value), "run": int(sample["run"]), "time": time.perf_counter() - t0}
        log.append(entry)
        if _is_main():
            with open(log_path, "a") as f:
                f.write(json.dumps(entry) + "\n")
            if not cfg.quiet and (step % cfg.log_every == 0 or step == 1 or step == cfg.steps):
                line = f"step {step:5d}  loss {entry['loss']:.5f}  ({entry['time']:.1f} s)"
                if bar is not None:
                    bar.write(line)
                else:
                    print(line, flush=True)
            if bar is not None:
                bar.set_postfix(loss=f"{entry['loss']:.4f}", refresh=False)
                bar.update()
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            if _is_main():
                _atomic_save(
                    {
                        "model": model.state_dict(),
                        "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(),
                        "step": step,
                        "log": log,
                        "config": asdict(cfg),
                        "rng": torch.get_rng_state(),
                    },
                    ckpt_path,
                )
            if dist.is_initialized():
                barrier()
    if bar is not None:
        bar.close()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rank, world = group_rank_and_size() or (0, 1)
    summary = {
        "rank": rank,
        "world": world,
        "points_last_step": int(n_points),
        "peak_rss_mb": peak_mb,
        "seconds": time.perf_counter() - t0,
        "losses": [e["loss"] for e in log],
    }
    if dist.is_initialized():
        summary["per_rank"] = all_gather_object({k: summary[k] for k in ("rank", "points_last_step", "peak_rss_mb")})
    else:
        summary["per_rank"] = [{k: summary[k] for k in ("rank", "points_last_step", "peak_rss_mb")}]
    if _is_main():
        _atomic_write_text(out / "train_summary.json", json.dumps(summary, indent=1))
    return summary


def _progress_bar(cfg: TrainConfig, start: int) -> Any:
    """A tqdm bar with an ETA on rank 0 when stderr is a terminal (None otherwise).

    tqdm's monitor thread is turned off: no background Python thread may be alive when a rank exits.
    """
    if cfg.quiet or not _is_main():
        return None
    from tqdm import tqdm

    class _Bar(tqdm):
        monitor_interval = 0

    bar = _Bar(total=cfg.steps, initial=start, desc="train", unit="step", disable=None, dynamic_ncols=True)
    if bar.disable:
        bar.close()
        return None
    return bar


def evaluate(store: str, checkpoint: str, split: str = "test", out: str | None = None) -> dict[str, Any]:
    """Relative L2 per field and drag/lift coefficients on every run of ``split``.

    Cd/Cl are computed three ways: from the predicted fields, from the true fields stored, and
    read from ``force_mom_i.csv`` of the raw data (when its folder is still there).
    """
    from .datasets.drivaerml import read_csv_row

    if not Path(checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint: {checkpoint} not found (write one with meshshard train)")
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    cfg = TrainConfig(**{**ckpt["config"], "store": store, "resume": False})
    mesh, _, _ = _setup(1)
    ds = _dataset(cfg, split, mesh, None)
    model = cfg.model()
    model.load_state_dict(ckpt["model"])
    model.eval()
    source = Path(ds.meta.get("source") or "")
    results = []
    with torch.no_grad():
        for i in range(len(ds)):
            sample = ds[i]
            run = int(sample["run"])
            x, t = features(sample, ds.stats)
            y = _predict(cfg, model, sample, x, ds.stats)
            rel = _relative_l2(y, t, ds)
            csv = source / f"run_{run}" / f"force_mom_{run}.csv"
            row = read_csv_row(csv) if csv.is_file() else None
            free_stream = {"reference_area": row["Aref"] if row else 1.0, "rho": row["rho"] if row else RHO,
                           "u_inf": row["Uinf"] if row else U_INF}
            geometry = (sample["pos"], sample["normals"], sample["areas"])
            pred = integrate_forces(*geometry, ds.denormalize("pMeanTrim", y[..., 0]),
                                    ds.denormalize("wallShearStressMeanTrim", y[..., 1:4]), **free_stream)
            true = integrate_forces(*geometry, ds.denormalize("pMeanTrim", t[..., 0]),
                                    ds.denormalize("wallShearStressMeanTrim", t[..., 1:4]), **free_stream)
            results.append(
                {
                    "run": run,
                    "rel_l2": rel,
                    "Cd_pred": pred["Cd"],
                    "Cd_true": true["Cd"],
                    "Cd_csv": row["Cd"] if row else None,
                    "Cl_pred": pred["Cl"],
                    "Cl_true": true["Cl"],
                    "Cl_csv": row["Cl"] if row else None,
                    "num_points": int(x.global_shape[0]) if isinstance(x, ShardTensor) else int(x.shape[0]),
                }
            )
    summary = {"split": split, "runs": results}
    if results:
        summary["mean_rel_l2"] = {k: sum(r["rel_l2"][k] for r in results) / len(results) for k in TARGETS}
    if out and _is_main():
        _atomic_write_text(Path(out), json.dumps(summary, indent=1))
    return summary
