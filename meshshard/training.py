"""Domain-parallel training and evaluation of a Transolver or MeshGraphNet surrogate on a DrivaerML store.

The loop behind ``meshshard train`` and ``meshshard evaluate``, public so that scripts can run it:
``train(TrainConfig(store, out, steps=..., model_config=TransolverConfig(n_hidden=...)))`` and
``evaluate(store, checkpoint)``.

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

Checkpoints cannot run code: one holds only tensors and plain types (numbers, strings, lists,
dicts: the config as a dict, the RNG state as a uint8 tensor), and every read is
``torch.load(weights_only=True)`` (:func:`load_checkpoint`), so a shared or downloaded file is
data, never a program. Anything else (a file that needs arbitrary unpickling, missing entries,
unexpected types, weights that do not fit the model) raises :class:`~meshshard.errors.CheckpointError`
naming the file and what was expected, before anything is written. A file from an older meshshard
that holds the few Python objects such files could hold is rewritten by :func:`convert_checkpoint`.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import pickle
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import faults
from ._atomic import atomic_write
from ._checks import check_choice, check_positive_int, check_positive_real
from .comm import all_gather_object, all_reduce, barrier, group_rank_and_size
from .datasets.synthetic import RHO, U_INF, integrate_forces
from .device_mesh import init_mesh
from .errors import CheckpointError
from .faults import install_excepthook
from .nn import Transolver, TransolverConfig, sync_gradients
from .tensor import ShardTensor

__all__ = [
    "TrainConfig",
    "MeshGraphNetConfig",
    "train",
    "evaluate",
    "features",
    "load_checkpoint",
    "check_resume",
    "convert_checkpoint",
    "CHECKPOINT_KEYS",
    "TARGETS",
    "INPUTS",
    "TARGET_CHANNELS",
    "INPUT_CHANNELS",
]

#: The channel layout, defined once: the surface inputs and targets (DrivaerML names) with their widths, in
#: channel order. :func:`features` builds the columns in this order, the models' ``in_dim``/``out_dim`` are
#: the sums, and :func:`evaluate` reads each predicted field from its slice.
INPUT_CHANNELS = {"pos": 3, "normals": 3}
TARGET_CHANNELS = {"pMeanTrim": 1, "wallShearStressMeanTrim": 3}
INPUTS = tuple(INPUT_CHANNELS)
TARGETS = tuple(TARGET_CHANNELS)
IN_DIM = sum(INPUT_CHANNELS.values())
OUT_DIM = sum(TARGET_CHANNELS.values())
#: MeshGraphNet's edge inputs (:func:`_predict`): the standardised relative position and its length.
EDGE_DIM = 3 + 1
#: The models ``TrainConfig.arch`` names.
ARCHS = ("transolver", "transolver++", "meshgraphnet")


def _slices(widths: dict[str, int]) -> dict[str, slice]:
    starts = [0]
    for width in widths.values():
        starts.append(starts[-1] + width)
    return {name: slice(a, b) for name, a, b in zip(widths, starts, starts[1:])}


_TARGET_CHANNELS = _slices(TARGET_CHANNELS)


@dataclass(frozen=True)
class MeshGraphNetConfig:
    """A :class:`~meshshard.nn.MeshGraphNet`'s width and depth, as :class:`TrainConfig` builds it.

    The defaults are :class:`~meshshard.nn.TransolverConfig`'s width and depth (as before the model
    configuration was nested), so ``--n-hidden``/``--n-layers`` mean the same for both models.
    """

    hidden: int = TransolverConfig.n_hidden
    num_layers: int = TransolverConfig.n_layers

    def __post_init__(self) -> None:
        check_positive_int(self.hidden, "hidden")
        check_positive_int(self.num_layers, "num_layers")


#: The model fields a checkpoint's config held at the top level before ``model_config`` was nested.
_FLAT_MODEL_FIELDS = ("n_hidden", "n_layers", "n_head", "slice_num", "mlp_ratio")


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved in every checkpoint, as ``dataclasses.asdict``).

    ``model_config`` is the model's own configuration: a :class:`~meshshard.nn.TransolverConfig` for
    ``arch="transolver"`` / ``"transolver++"``, a :class:`MeshGraphNetConfig` for ``"meshgraphnet"``;
    ``None`` (the default) means that configuration's defaults. :meth:`from_dict` reads a saved config
    back, also the flat layout of older checkpoints (``n_hidden`` ... ``mlp_ratio`` at the top level).
    """

    store: str
    out: str
    steps: int = 200
    lr: float = 2e-3
    weight_decay: float = 1e-4
    model_config: TransolverConfig | MeshGraphNetConfig | None = None
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
        check_choice(self.arch, "arch", ARCHS)
        kind = MeshGraphNetConfig if self.arch == "meshgraphnet" else TransolverConfig
        if self.model_config is None:
            self.model_config = kind()
        elif not isinstance(self.model_config, kind):
            raise TypeError(
                f"model_config must be a {kind.__name__} for arch {self.arch!r} "
                f"(got {type(self.model_config).__name__})"
            )
        for name in ("steps", "checkpoint_every", "log_every", "dp", "knn_k"):
            check_positive_int(getattr(self, name), name)
        check_positive_int(self.num_points, "num_points", allow_none=True)
        check_positive_real(self.lr, "lr")
        check_positive_real(self.weight_decay, "weight_decay", zero=True)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TrainConfig:
        """The config ``dataclasses.asdict(cfg)`` wrote (a checkpoint's ``"config"``), as a TrainConfig.

        Also reads the flat layout written before ``model_config`` was nested: ``n_hidden``, ``n_layers``,
        ``n_head``, ``slice_num``, ``mlp_ratio`` at the top level (MeshGraphNet used the first two).

        Raises
        ------
        TypeError, ValueError
            If the fields do not make a valid TrainConfig (unknown fields, both layouts at once, bad values).
        """
        values = dict(config)
        flat = {name: values.pop(name) for name in _FLAT_MODEL_FIELDS if name in values}
        model = values.get("model_config")
        if flat and model is not None:
            raise ValueError(f"config has both model_config and the older top-level model fields {sorted(flat)}")
        if values.get("arch", "transolver") == "meshgraphnet":
            kind = MeshGraphNetConfig
            if flat:
                model = {"hidden": flat.get("n_hidden", kind.hidden),
                         "num_layers": flat.get("n_layers", kind.num_layers)}
        else:
            kind = TransolverConfig
            model = flat or model
        if isinstance(model, dict):
            values["model_config"] = kind(**model)
        return cls(**values)

    def model(self) -> torch.nn.Module:
        torch.manual_seed(self.seed)
        m = self.model_config
        if isinstance(m, MeshGraphNetConfig):
            from .nn.meshgraphnet import MeshGraphNet  # torch-geometric: imported only when used

            return MeshGraphNet(IN_DIM, EDGE_DIM, OUT_DIM, hidden=m.hidden, num_layers=m.num_layers)
        return Transolver(
            in_dim=IN_DIM,
            out_dim=OUT_DIM,
            **asdict(m),
            checkpoint=self.grad_checkpoint,
            variant="plus" if self.arch == "transolver++" else "plain",
            seed=self.seed,
        )


def features(sample: dict[str, torch.Tensor], stats: dict[str, tuple[torch.Tensor, torch.Tensor]]):
    """Model inputs ``(N, IN_DIM)`` and normalised targets ``(N, OUT_DIM)`` of a (sharded or whole) sample.

    Inputs (:data:`INPUT_CHANNELS`): position standardised with the store's training statistics, and the
    unit normal. Targets (:data:`TARGET_CHANNELS`): ``pMeanTrim`` and ``wallShearStressMeanTrim`` as
    returned by a dataset built with ``normalize=True`` (standardised).
    """
    missing = [name for name in (*INPUTS, *TARGETS) if name not in sample]
    if missing or "pos" not in stats:
        raise ValueError(
            f"features needs a sample with {list(INPUTS + TARGETS)} and stats with 'pos' "
            f"(sample lacks {missing}; stats has {sorted(stats)})"
        )
    mean, std = stats["pos"]
    inputs = {**sample, "pos": (sample["pos"] - mean) / std}
    x = torch.cat([_columns(inputs[name]) for name in INPUTS], dim=-1)
    t = torch.cat([_columns(sample[name]) for name in TARGETS], dim=-1)
    return x, t


def _columns(values: torch.Tensor) -> torch.Tensor:
    """A field as ``(N, width)`` columns: a scalar field ``(N,)`` gains its channel dimension."""
    return values.unsqueeze(-1) if values.dim() == 1 else values


def _target(y: torch.Tensor, name: str) -> torch.Tensor:
    """Target field ``name`` of a model output: ``(N,)`` for a scalar field, ``(N, width)`` otherwise."""
    ch = _TARGET_CHANNELS[name]
    return y[..., ch.start] if ch.stop - ch.start == 1 else y[..., ch]


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


# -- checkpoints: tensors and plain types only, read without running code ----------------------------
#: The entries of a checkpoint written by :func:`train`; :func:`evaluate` needs ``model`` and ``config``.
CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "step", "log", "config", "rng")
#: Layout version written in ``"format"`` (checkpoints written before it have none and read alike).
CHECKPOINT_FORMAT = 1
_EXPECTED = {
    "model": (dict, "a dict of tensors (model.state_dict())"),
    "optimizer": (dict, "a dict (the optimizer's state_dict())"),
    "scheduler": (dict, "a dict (the LR scheduler's state_dict())"),
    "step": (int, "a non-negative int"),
    "log": (list, "a list of per-step dicts"),
    "config": (dict, "a dict of TrainConfig fields"),
    "rng": (torch.Tensor, "a uint8 tensor (torch.get_rng_state())"),
    "format": (int, f"the int {CHECKPOINT_FORMAT}"),
}
#: The only classes :func:`convert_checkpoint` lets a weights-only read rebuild: a ``TrainConfig``
#: (its fields are set from the file, none of the file's code runs) and filesystem paths.
_CONVERTIBLE = (pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePosixPath, pathlib.PureWindowsPath)


def _not_plain(value: Any) -> str | None:
    """The type name of the first value that is neither a tensor nor a plain type, or None."""
    if value is None or isinstance(value, bool | int | float | str | torch.Tensor):
        return None
    if isinstance(value, list | tuple):
        items = list(value)
    elif isinstance(value, dict):
        bad_keys = [type(k).__name__ for k in value if not isinstance(k, str | int)]
        if bad_keys:
            return f"dict key of type {bad_keys[0]}"
        items = list(value.values())
    else:
        return type(value).__name__
    return next((found for found in map(_not_plain, items) if found is not None), None)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _read_weights_only(path: str, allowed: tuple = ()) -> Any:
    """``torch.load(path, weights_only=True)``, every failure a :class:`CheckpointError` naming ``path``."""
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        try:
            found = ", ".join(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        except Exception:  # not a zip checkpoint: torch's message is the only account of what it holds
            found = next((line for line in lines if "GLOBAL" in line), "")
        if not found:  # refused for another reason than Python objects: not a torch checkpoint at all
            after = [b for a, b in zip(lines, lines[1:]) if a.endswith("WeightsUnpickler error:")]
            raise CheckpointError(
                f"{path} is not a checkpoint written by 'meshshard train' (torch.load failed: "
                f"{after[0] if after else _first_line(exc)})"
            ) from None
        raise CheckpointError(
            f"{path} is not a meshshard checkpoint: loading it would need Python objects that can run code "
            f"({found}); meshshard reads only tensors and plain types (torch.load(weights_only=True)). If you "
            "trust the file and it came from an older meshshard, rewrite it once with "
            "meshshard.training.convert_checkpoint(SRC, DST)"
        ) from None
    except Exception as exc:  # zip, storage and EOF errors all mean "not a torch checkpoint"
        raise CheckpointError(
            f"{path} is not a checkpoint written by 'meshshard train' (torch.load failed: {_first_line(exc)})"
        ) from None


def _check_entries(ckpt: Any, path: str, required: tuple[str, ...]) -> None:
    if not isinstance(ckpt, dict):
        raise CheckpointError(
            f"{path} is not a checkpoint written by 'meshshard train' (expected a dict with entries "
            f"{list(CHECKPOINT_KEYS)}; found a {type(ckpt).__name__})"
        )
    missing = [k for k in required if k not in ckpt]
    if missing:
        raise CheckpointError(
            f"{path} is not a complete meshshard checkpoint: it lacks {missing} (expected entries "
            f"{list(required)}; found {sorted(map(str, ckpt))})"
        )
    if ckpt.get("format", CHECKPOINT_FORMAT) != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path} was written in checkpoint format {ckpt['format']!r}; this meshshard reads format "
            f"{CHECKPOINT_FORMAT} (and the unversioned files written before it)"
        )
    for key, (kind, what) in _EXPECTED.items():
        if key not in ckpt:
            continue
        value = ckpt[key]
        found = None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            found = type(value).__name__
        elif key == "model":
            found = next((type(v).__name__ for v in value.values() if not isinstance(v, torch.Tensor)), None)
        elif key == "step" and value < 0:
            found = str(value)
        elif key == "rng" and (value.dtype != torch.uint8 or value.dim() != 1):
            found = f"a {value.dim()}-d {value.dtype} tensor"
        else:
            found = _not_plain(value)
        if found is not None:
            raise CheckpointError(f"{path}: the checkpoint's '{key}' must be {what} (found {found})")
    known = {f.name for f in fields(TrainConfig)} | set(_FLAT_MODEL_FIELDS)  # the flat layout of older files
    unknown = sorted(set(ckpt["config"]) - known) if "config" in ckpt else []
    if unknown:
        raise CheckpointError(
            f"{path}: the checkpoint's config has fields this meshshard's TrainConfig lacks: {unknown} "
            "(written by another version)"
        )


def load_checkpoint(path: str | os.PathLike, *, resume: bool = False) -> dict[str, Any]:
    """Read a checkpoint written by :func:`train`, running no code from the file.

    The file is read with ``torch.load(weights_only=True)`` and its entries are checked: a dict
    with ``model`` and ``config`` (and, with ``resume=True``, every entry of
    :data:`CHECKPOINT_KEYS`), each of the expected type, holding only tensors and plain types.

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a file.
    CheckpointError
        If the file is not such a checkpoint (it needs Python objects to load, is not a torch
        file, lacks entries or holds unexpected types); the message names the file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint: {path} not found (write one with meshshard train)")
    ckpt = _read_weights_only(path)
    _check_entries(ckpt, path, CHECKPOINT_KEYS if resume else ("model", "config"))
    return ckpt


def _config_of(ckpt: dict, path: str, **overrides: Any) -> TrainConfig:
    """The checkpoint's TrainConfig, with ``overrides``; a bad config is a :class:`CheckpointError`."""
    try:
        return TrainConfig.from_dict({**ckpt["config"], **overrides})
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{path}: the checkpoint's config is not a valid TrainConfig ({_first_line(exc)})"
        ) from None


def _restore(ckpt: dict, path: str, model: torch.nn.Module, opt, sched) -> None:
    """Load the checkpoint's states into ``model`` (and ``opt``, ``sched`` unless None)."""
    parts = [("model", model), ("optimizer", opt), ("scheduler", sched)]
    for key, target in parts:
        if target is None:
            continue
        try:
            target.load_state_dict(ckpt[key])
        except Exception as exc:  # shapes, names or layouts of another model or optimiser
            raise CheckpointError(
                f"{path}: the checkpoint's '{key}' does not fit this run's {type(target).__name__} "
                f"(was it written with other model options?): {_first_line(exc)}"
            ) from None


def _optimizer(cfg: TrainConfig, model: torch.nn.Module):
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.steps, eta_min=cfg.lr * 0.05)


def check_resume(cfg: TrainConfig) -> bool:
    """Whether ``train(cfg)`` with ``resume=True`` would continue from ``cfg.out/checkpoint.pt``.

    ``False`` when there is no checkpoint; ``True`` when it reads and fits this configuration's
    model, optimizer and scheduler. Reads only (the CLI calls it before starting any rank).

    Raises
    ------
    CheckpointError
        If the file is there but is not a checkpoint :func:`train` can resume from.
    """
    path = Path(cfg.out) / "checkpoint.pt"
    if not path.exists():
        return False
    ckpt = load_checkpoint(path, resume=True)
    model = cfg.model()
    _restore(ckpt, str(path), model, *_optimizer(cfg, model))
    return True


def convert_checkpoint(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Rewrite a checkpoint that holds a ``TrainConfig`` object or paths as a plain one at ``dst``.

    For files written by an older meshshard (or by hand) with ``torch.save`` of such objects, which
    :func:`load_checkpoint` refuses. The file is still read weights-only: the only classes rebuilt
    are :class:`TrainConfig` (its fields are set, no code runs) and ``pathlib`` paths (turned into
    strings); anything else is refused with :class:`CheckpointError`. ``dst`` must not exist.
    Returns ``dst``.
    """
    src, dst = os.fspath(src), Path(dst)
    if not os.path.isfile(src):
        raise FileNotFoundError(f"checkpoint: {src} not found")
    if dst.exists():
        raise FileExistsError(f"convert_checkpoint: {dst} exists; choose a new file name (nothing is overwritten)")
    ckpt = _read_weights_only(src, (TrainConfig, TransolverConfig, MeshGraphNetConfig, *_CONVERTIBLE))

    def plain(value: Any) -> Any:
        if isinstance(value, TrainConfig | TransolverConfig | MeshGraphNetConfig):
            return plain(dict(vars(value)))
        if isinstance(value, pathlib.PurePath):
            return str(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(plain(v) for v in value)
        return value

    ckpt = plain(ckpt)
    _check_entries(ckpt, src, ("model", "config"))
    _atomic_save(ckpt, dst)
    return dst


def _setup(dp: int):
    """``(mesh, dp_rank, dp_size)``; ``mesh`` is None single-process without a process group."""
    if not dist.is_initialized() and "RANK" not in os.environ:
        return None, 0, 1
    world = int(os.environ.get("WORLD_SIZE", "1")) if not dist.is_initialized() else dist.get_world_size()
    if dp < 1 or world % dp:
        raise ValueError(f"dp ({dp}) must divide the number of ranks ({world})")
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
    from .ops.metrics import relative_l2_error

    out = {}
    for name, ch in _TARGET_CHANNELS.items():
        yp = ds.denormalize(name, y[..., ch]).flatten(-2)  # one norm over the points and the field's channels
        tp = ds.denormalize(name, t[..., ch]).flatten(-2)
        out[name] = float(relative_l2_error(yp, tp, dim=-1, eps=1e-15))  # eps: a zero field gives a finite error
    return out


@dataclass
class _Run:
    """The state of one training run, as :func:`_start` sets it up (or resumes it from its checkpoint)."""

    cfg: TrainConfig
    mesh: Any
    dp_rank: int
    ds: Any
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: Any
    out: Path
    start: int = 0
    log: list[dict] = field(default_factory=list)

    @property
    def dp_group(self) -> Any:
        return self.mesh.get_group(0) if self.cfg.dp > 1 else None


@faults.entry
def train(cfg: TrainConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train; return a summary (final loss, losses per step, per-rank points and peak memory).

    ``log`` receives rank 0's progress lines (``step ... loss ...`` every ``log_every`` steps, and a note
    when ``resume=True`` finds no checkpoint); by default they are printed (through the progress bar on a
    terminal). ``quiet=True`` turns both off.

    Raises
    ------
    CheckpointError
        With ``resume=True``, if ``out/checkpoint.pt`` exists but is not a checkpoint this run can
        continue from (see :func:`load_checkpoint`); raised on every rank, before any file is written.
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a meshshard.training.TrainConfig (got {type(cfg).__name__})")
    cfg = replace(cfg)  # runs TrainConfig's checks again: the fields may have been changed since construction
    bar = None
    if log is None:
        def log(line: str) -> None:
            (bar.write if bar is not None else functools.partial(print, flush=True))(line)
    run = _start(cfg, log)
    bar = _progress_bar(cfg, run.start)
    t0 = time.perf_counter()
    n_points = 0
    for step in range(run.start + 1, cfg.steps + 1):
        entry, n_points = _step(run, step, t0)
        _log_step(run, entry, bar, log)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            _save_checkpoint(run, step)
    if bar is not None:
        bar.close()
    return _summary(run, n_points, t0)


def _start(cfg: TrainConfig, log: Callable[[str], None]) -> _Run:
    """Process group, dataset, model and optimiser; the checkpoint's state with ``resume``; a fresh log file."""
    mesh, dp_rank, _ = _setup(cfg.dp)
    if mesh is not None:
        install_excepthook()  # a rank that dies of an exception is named in the others' errors
    out = Path(cfg.out)
    if _is_main():
        out.mkdir(parents=True, exist_ok=True)
    ds = _dataset(cfg, "train", mesh, cfg.num_points)
    if len(ds) == 0:
        raise ValueError(f"the store {cfg.store} has no training runs")
    model = cfg.model()
    run = _Run(cfg, mesh, dp_rank, ds, model, *_optimizer(cfg, model), out)
    ckpt_path = out / "checkpoint.pt"
    if cfg.resume and ckpt_path.exists():
        ckpt = _agreed(lambda: _resume_from(ckpt_path, model, run.opt, run.sched))  # nothing written before this
        run.start, run.log = ckpt["step"], ckpt["log"]
        torch.set_rng_state(ckpt["rng"])
        model.rng_step = run.start  # Transolver++'s Gumbel noise continues the run's sequence
    elif cfg.resume and not cfg.quiet and _is_main():
        log(f"no checkpoint in {out}: starting from step 0")
    if _is_main():
        # the log holds exactly the steps up to the checkpoint: none lost, none repeated
        _atomic_write_text(out / "log.jsonl", "".join(json.dumps(e) + "\n" for e in run.log))
    return run


def _step(run: _Run, step: int, t0: float) -> tuple[dict[str, Any], int]:
    """One optimiser step on this step's sample; its log entry (the loss averaged over the data-parallel
    axis) and this rank's number of points."""
    cfg, dp = run.cfg, run.cfg.dp
    run.ds.set_epoch(step)
    sample = run.ds[((step - 1) * dp + run.dp_rank) % len(run.ds)]
    x, t = features(sample, run.ds.stats)
    run.model.train()
    y = _predict(cfg, run.model, sample, x, run.ds.stats)
    loss = ((y - t) ** 2).mean()
    run.opt.zero_grad(set_to_none=True)
    loss.backward()
    if run.mesh is not None:
        sync_gradients(run.model, run.mesh)
    run.opt.step()
    run.sched.step()
    value = loss.detach().reshape(1).clone()
    if run.dp_group is not None:
        value = all_reduce(value, run.dp_group) / dp
    entry = {"step": step, "loss": float(value), "run": int(sample["run"]), "time": time.perf_counter() - t0}
    run.log.append(entry)
    return entry, x.shape[0]


def _log_step(run: _Run, entry: dict[str, Any], bar: Any, log: Callable[[str], None]) -> None:
    """Rank 0 appends the step to ``log.jsonl``, and reports it every ``log_every`` steps (and the first, last)."""
    if not _is_main():
        return
    cfg, step = run.cfg, entry["step"]
    with open(run.out / "log.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
    if not cfg.quiet and (step % cfg.log_every == 0 or step == 1 or step == cfg.steps):
        log(f"step {step:5d}  loss {entry['loss']:.5f}  ({entry['time']:.1f} s)")
    if bar is not None:
        bar.set_postfix(loss=f"{entry['loss']:.4f}", refresh=False)
        bar.update()


def _save_checkpoint(run: _Run, step: int) -> None:
    """Rank 0 writes ``checkpoint.pt`` atomically (tensors and plain types only); every rank then waits."""
    if _is_main():
        _atomic_save(
            {
                "format": CHECKPOINT_FORMAT,
                "model": run.model.state_dict(),
                "optimizer": run.opt.state_dict(),
                "scheduler": run.sched.state_dict(),
                "step": step,
                "log": run.log,
                "config": asdict(run.cfg),
                "rng": torch.get_rng_state(),
            },
            run.out / "checkpoint.pt",
        )
    if dist.is_initialized():
        barrier()


def _summary(run: _Run, n_points: int, t0: float) -> dict[str, Any]:
    """The run's summary (every rank's points and peak memory gathered), written by rank 0."""
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rank, world = group_rank_and_size() or (0, 1)
    summary = {
        "rank": rank,
        "world": world,
        "points_last_step": int(n_points),
        "peak_rss_mb": peak_mb,
        "seconds": time.perf_counter() - t0,
        "losses": [e["loss"] for e in run.log],
    }
    mine = {k: summary[k] for k in ("rank", "points_last_step", "peak_rss_mb")}
    summary["per_rank"] = all_gather_object(mine) if dist.is_initialized() else [mine]
    if _is_main():
        _atomic_write_text(run.out / "train_summary.json", json.dumps(summary, indent=1))
    return summary


def _resume_from(path: Path, model: torch.nn.Module, opt, sched) -> dict:
    ckpt = load_checkpoint(path, resume=True)
    _restore(ckpt, str(path), model, opt, sched)
    return ckpt


def _agreed(read: Any) -> Any:
    """``read()`` on every rank, and one verdict: if it raised a CheckpointError on any rank, every rank
    raises the first rank's (one all-gather when a process group is up)."""
    result, message = None, None
    try:
        result = read()
    except CheckpointError as exc:
        message = str(exc)
    if dist.is_initialized():
        message = next((m for m in all_gather_object(message) if m is not None), None)
    if message is not None:
        raise CheckpointError(message)
    return result


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


@faults.entry
def evaluate(store: str, checkpoint: str, split: str = "test", out: str | None = None) -> dict[str, Any]:
    """Relative L2 per field and drag/lift coefficients on every run of ``split``.

    Cd/Cl are computed three ways: from the predicted fields, from the true fields stored, and
    read from ``force_mom_i.csv`` of the raw data (when its folder is still there).

    Raises
    ------
    FileNotFoundError
        If ``checkpoint`` is not a file.
    CheckpointError
        If it is not a checkpoint written by :func:`train` (see :func:`load_checkpoint`), or its
        weights do not fit the model its config describes.
    """
    from .datasets.drivaerml import read_csv_row

    checkpoint = os.fspath(checkpoint)
    if not Path(checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint: {checkpoint} not found (write one with meshshard train)")
    mesh, _, _ = _setup(1)

    def read() -> tuple[TrainConfig, torch.nn.Module]:
        ckpt = load_checkpoint(checkpoint)
        out_dir = ckpt["config"].get("out", os.path.dirname(os.path.abspath(checkpoint)))
        cfg = _config_of(ckpt, checkpoint, store=store, out=out_dir, resume=False)
        model = cfg.model()
        _restore(ckpt, checkpoint, model, None, None)
        return cfg, model

    cfg, model = _agreed(read)
    ds = _dataset(cfg, split, mesh, None)
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
            pred, true = (
                integrate_forces(*geometry, ds.denormalize("pMeanTrim", _target(v, "pMeanTrim")),
                                 ds.denormalize("wallShearStressMeanTrim", _target(v, "wallShearStressMeanTrim")),
                                 **free_stream)
                for v in (y, t)
            )
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
