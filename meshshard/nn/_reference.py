"""Weights of :class:`~meshshard.nn.Transolver` from and to the published models' state dicts.

Names on the left are this library's (``L`` layers, ``i`` a layer, ``last = L - 1``); on the
right the reference's. Shapes: ``C`` width, ``H`` heads, ``D = C / H``, ``M`` slices,
``R`` MLP width (``mlp_ratio * C``).

**thuml** — ``thuml/Transolver`` (``PDE-Solving-StandardBenchmark/model/Transolver_Irregular_Mesh.py``
``Model``; ``Car-Design-ShapeNetCar/models/Transolver.py`` has the same names) and
``thuml/Transolver_plus`` (``models/Transolver_plus.py`` ``Model``)::

    preprocess.0.{weight,bias}             preprocess.linear_pre.0.{weight,bias}     (2C, in), (2C,)
    preprocess.2.{weight,bias}             preprocess.linear_post.{weight,bias}      (C, 2C), (C,)
    placeholder                            placeholder                               (C,)
    cond_embed.{weight,bias}               embedding.{weight,bias}         (plus)    (C, cond), (C,)
    blocks.i.ln_1.*                        blocks.i.ln_1.*                           (C,)
    blocks.i.attn.temperature  (H, 1, 1)   blocks.i.Attn.temperature (plain)         (1, H, 1, 1)
                                           blocks.i.Attn.bias        (plus)          (1, H, 1, 1)
    blocks.i.attn.proj_temperature.{0,2}.* blocks.i.Attn.proj_temperature.{0,2}.*    (M, D), (1, M)
    blocks.i.attn.in_project_x.*           blocks.i.Attn.in_project_x.*              (C, C)
    blocks.i.attn.in_project_fx.*          blocks.i.Attn.in_project_fx.*   (plain)   (C, C)
    blocks.i.attn.in_project_slice.*       blocks.i.Attn.in_project_slice.*          (M, D)
    blocks.i.attn.to_{q,k,v}.weight        blocks.i.Attn.to_{q,k,v}.weight           (D, D)
    blocks.i.attn.to_out.0.*               blocks.i.Attn.to_out.0.*                  (C, C)
    blocks.i.ln_2.*                        blocks.i.ln_2.*
    blocks.i.mlp.0.*                       blocks.i.mlp.linear_pre.0.*               (R, C)
    blocks.i.mlp.2.*                       blocks.i.mlp.linear_post.*                (C, R)
    ln_out.*                               blocks.last.ln_3.*
    head.*                                 blocks.last.mlp2.*                        (out, C)

The thuml models take ``cat(pos, fx)``: ``in_dim = space_dim + fun_dim``; pass that concatenation.
Transolver++'s ``Model`` always holds ``embedding = Linear(3, C)`` (a condition that is used only
when given), so a thuml++ state dict gives ``cond_dim = 3``, and a model without a condition
exports zeros there. ``unified_pos`` models load (their wider input is inferred), but the caller
computes the grid-distance features the reference concatenates; ``Time_Input`` models raise a clear error.

**physicsnemo** — ``physicsnemo.models.transolver.Transolver(..., use_te=False)``, irregular mesh
(``structured_shape=None``), naming as of PhysicsNeMo 2026-08 (``_TransolverMlp`` = ``Mlp``)::

    preprocess.0.*                         preprocess.layers.0.*
    preprocess.2.weight                    preprocess.layers.2.weight
    preprocess.2.bias + placeholder        preprocess.layers.2.bias   (PhysicsNeMo has no placeholder:
                                                                       it is folded into this bias; on
                                                                       import placeholder = 0)
    blocks.i.ln_1.*                        blocks.i.ln_1.*
    blocks.i.attn.temperature  (H, 1, 1)   blocks.i.Attn.temperature                 (1, 1, H, 1)
    blocks.i.attn.proj_temperature.*       blocks.i.Attn.proj_temperature.*          (plus)
    blocks.i.attn.in_project_{x,fx,slice}.* blocks.i.Attn.in_project_{x,fx,slice}.*
    blocks.i.attn.to_{q,k,v}.weight        blocks.i.Attn.qkv_project.weight          (3D, D): rows q, k, v
    blocks.i.attn.to_out.0.*               blocks.i.Attn.out_linear.*
    blocks.i.ln_2.*                        blocks.i.ln_mlp1.0.*
    blocks.i.mlp.{0,2}.*                   blocks.i.ln_mlp1.1.layers.{0,2}.*
    ln_out.*                               blocks.last.ln_mlp2.0.*
    head.*                                 blocks.last.ln_mlp2.1.*

PhysicsNeMo computes ``cat(embedding, fx)``: ``in_dim = embedding_dim + functional_dim``. It clamps
the plain temperature to ``[0.5, 5]`` and normalises the tokens with ``eps = 1e-2``; a model built
by :func:`from_reference` with ``source="physicsnemo"`` does the same, and exporting to PhysicsNeMo
requires those settings. Transformer Engine layouts (``use_te=True``: ``ln_mlp1.fc1_weight``,
``_extra_state``, ...) and ``time_input`` models raise a clear error.

Dropout is not part of a state dict; the thuml plain model also drops attention weights among the
tokens (as here), PhysicsNeMo and Transolver++ do not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch

from .._checks import check_choice

SOURCES = ("thuml", "physicsnemo")
_PHYSICSNEMO = dict(eps=1e-2, temperature_range=(0.5, 5.0))

# one mapping entry: our names, reference names, ours -> reference, reference -> ours
Entry = tuple[list[str], list[str], Callable, Callable]


def _same(a: str, b: str) -> Entry:
    return [a], [b], lambda t: t, lambda t: t


def _linear(a: str, b: str, bias: bool = True) -> list[Entry]:
    out = [_same(f"{a}.weight", f"{b}.weight")]
    if bias:
        out.append(_same(f"{a}.bias", f"{b}.bias"))
    return out


def _entries(source: str, n_layers: int, variant: str, cond: bool) -> list[Entry]:
    """The name mapping of the module docstring, as a list."""
    e: list[Entry] = []
    last = n_layers - 1
    if source == "thuml":
        e += _linear("preprocess.0", "preprocess.linear_pre.0") + _linear("preprocess.2", "preprocess.linear_post")
        e.append(_same("placeholder", "placeholder"))
        if cond:
            e += _linear("cond_embed", "embedding")
    else:
        e += _linear("preprocess.0", "preprocess.layers.0")
        e.append(_same("preprocess.2.weight", "preprocess.layers.2.weight"))
        e.append((
            ["preprocess.2.bias", "placeholder"], ["preprocess.layers.2.bias"],
            lambda b, p: b + p, lambda b: (b, torch.zeros_like(b)),
        ))
    for i in range(n_layers):
        o, r = f"blocks.{i}", f"blocks.{i}.Attn"
        e += _linear(f"{o}.ln_1", f"{o}.ln_1")
        if source == "thuml":
            name = "bias" if variant == "plus" else "temperature"
            e.append(([f"{o}.attn.temperature"], [f"{r}.{name}"], lambda t: t.reshape(1, -1, 1, 1),
                      lambda t: t.reshape(-1, 1, 1)))
        else:
            e.append(([f"{o}.attn.temperature"], [f"{r}.temperature"], lambda t: t.reshape(1, 1, -1, 1),
                      lambda t: t.reshape(-1, 1, 1)))
        if variant == "plus":
            e += _linear(f"{o}.attn.proj_temperature.0", f"{r}.proj_temperature.0")
            e += _linear(f"{o}.attn.proj_temperature.2", f"{r}.proj_temperature.2")
        e += _linear(f"{o}.attn.in_project_x", f"{r}.in_project_x")
        if variant == "plain":
            e += _linear(f"{o}.attn.in_project_fx", f"{r}.in_project_fx")
        e += _linear(f"{o}.attn.in_project_slice", f"{r}.in_project_slice")
        if source == "thuml":
            for q in ("to_q", "to_k", "to_v"):
                e.append(_same(f"{o}.attn.{q}.weight", f"{r}.{q}.weight"))
            e += _linear(f"{o}.attn.to_out.0", f"{r}.to_out.0")
            e += _linear(f"{o}.ln_2", f"{o}.ln_2")
            e += _linear(f"{o}.mlp.0", f"{o}.mlp.linear_pre.0") + _linear(f"{o}.mlp.2", f"{o}.mlp.linear_post")
        else:
            e.append((
                [f"{o}.attn.to_q.weight", f"{o}.attn.to_k.weight", f"{o}.attn.to_v.weight"],
                [f"{r}.qkv_project.weight"],
                lambda q, k, v: torch.cat([q, k, v], dim=0), lambda qkv: tuple(qkv.chunk(3, dim=0)),
            ))
            e += _linear(f"{o}.attn.to_out.0", f"{r}.out_linear")
            e += _linear(f"{o}.ln_2", f"{o}.ln_mlp1.0")
            e += _linear(f"{o}.mlp.0", f"{o}.ln_mlp1.1.layers.0") + _linear(f"{o}.mlp.2", f"{o}.ln_mlp1.1.layers.2")
    if source == "thuml":
        e += _linear("ln_out", f"blocks.{last}.ln_3") + _linear("head", f"blocks.{last}.mlp2")
    else:
        e += _linear("ln_out", f"blocks.{last}.ln_mlp2.0") + _linear("head", f"blocks.{last}.ln_mlp2.1")
    return e


def _check_source(source: str) -> None:
    check_choice(source, "source", SOURCES)


def _clean(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"Expected 'state_dict' to be a mapping of names to tensors (got {type(state_dict).__name__})")
    sd = dict(state_dict)
    if sd and all(k.startswith("module.") for k in sd):  # saved from DistributedDataParallel
        sd = {k[len("module."):]: v for k, v in sd.items()}
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"state_dict values must be tensors (not for {bad[:3]})")
    return sd


def _need(sd: dict, key: str, source: str) -> torch.Tensor:
    if key not in sd:
        raise ValueError(f"not a {source} Transolver state dict: no {key!r} (found e.g. {sorted(sd)[:4]})")
    return sd[key]


def _infer(sd: dict[str, torch.Tensor], source: str) -> dict:
    """Constructor sizes and variant from the names and shapes of a reference state dict."""
    unsupported = [k for k in sd if k.endswith("_extra_state") or ".fc1_weight" in k or "layer_norm_weight" in k]
    if unsupported:
        raise ValueError(
            f"Transformer Engine layouts are not supported (found {unsupported[0]!r}); export the PhysicsNeMo "
            "model with use_te=False"
        )
    for k in sd:
        if k.startswith("time_fc") or k.startswith("time_embed"):
            raise ValueError(f"time-conditioned Transolvers are not supported (found {k!r})")
    layers = {int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))}
    if not layers or layers != set(range(max(layers) + 1)):
        raise ValueError(f"not a {source} Transolver state dict: blocks.<i> must run 0..L-1 (found {sorted(layers)})")
    n_layers = max(layers) + 1
    pre = "preprocess.linear_pre.0" if source == "thuml" else "preprocess.layers.0"
    pre_w = _need(sd, f"{pre}.weight", source)
    variant = "plus" if any(".Attn.proj_temperature." in k for k in sd) else "plain"
    attn = "blocks.0.Attn"
    slice_w = _need(sd, f"{attn}.in_project_slice.weight", source)
    x_w = _need(sd, f"{attn}.in_project_x.weight", source)
    n_hidden = x_w.shape[1]
    slice_num, dim_head = slice_w.shape
    if n_hidden % dim_head:
        raise ValueError(f"in_project_x width {n_hidden} is not a multiple of the head width {dim_head}")
    if pre_w.shape[0] != 2 * n_hidden:
        raise ValueError(
            f"the preprocessing MLP must be {pre_w.shape[1]} -> 2C -> C with C={n_hidden} (got hidden width "
            f"{pre_w.shape[0]})"
        )
    if source == "thuml":
        mlp_w = _need(sd, "blocks.0.mlp.linear_pre.0.weight", source)
        head_w = _need(sd, f"blocks.{n_layers - 1}.mlp2.weight", source)
        cond = sd.get("embedding.weight")
    else:
        mlp_w = _need(sd, "blocks.0.ln_mlp1.1.layers.0.weight", source)
        head_w = _need(sd, f"blocks.{n_layers - 1}.ln_mlp2.1.weight", source)
        cond = None
    return dict(
        in_dim=pre_w.shape[1], out_dim=head_w.shape[0], n_hidden=n_hidden, n_layers=n_layers,
        n_head=n_hidden // dim_head, slice_num=slice_num, mlp_ratio=mlp_w.shape[0] / n_hidden, variant=variant,
        cond_dim=None if cond is None else cond.shape[1],
    )


def from_reference(cls: type, state_dict: Mapping[str, torch.Tensor], source: str, options: dict):
    """See :meth:`meshshard.nn.Transolver.from_reference`."""
    _check_source(source)
    sd = _clean(state_dict)
    sizes = _infer(sd, source)
    clash = sorted(set(options) & set(sizes))
    if clash:
        raise ValueError(f"{clash} are inferred from the state dict; they cannot be passed as options")
    defaults = {}
    if source == "physicsnemo":
        defaults = dict(_PHYSICSNEMO) if sizes["variant"] == "plain" else {"eps": _PHYSICSNEMO["eps"]}
    model = cls(**sizes, **{**defaults, **options})
    floats = {v.dtype for v in sd.values() if v.is_floating_point()}
    if len(floats) == 1:
        model = model.to(floats.pop())
    ours = {}
    used = set()
    entries = _entries(source, sizes["n_layers"], sizes["variant"], sizes["cond_dim"] is not None)
    for our_names, ref_names, _, back in entries:
        missing = [k for k in ref_names if k not in sd]
        if missing:
            raise ValueError(f"the {source} state dict lacks {missing}")
        used.update(ref_names)
        values = back(*(sd[k] for k in ref_names))
        values = values if isinstance(values, tuple) else (values,)
        ours.update(zip(our_names, values))
    extra = sorted(set(sd) - used)
    if extra:
        raise ValueError(f"unexpected names in the {source} state dict: {extra[:6]}{' ...' if len(extra) > 6 else ''}")
    expected = model.state_dict()
    wrong = [f"{k}: {tuple(v.shape)} (expected {tuple(expected[k].shape)})" for k, v in ours.items()
             if tuple(v.shape) != tuple(expected[k].shape)]
    if wrong:
        raise ValueError(f"shapes disagree with the inferred configuration: {wrong[:4]}")
    model.load_state_dict(ours, strict=True)
    return model


def reference_state_dict(model, source: str) -> dict[str, torch.Tensor]:
    """See :meth:`meshshard.nn.Transolver.reference_state_dict`."""
    _check_source(source)
    cfg = model.config
    if source == "thuml":
        want = dict(eps=1e-5, temperature_range=None)
    else:
        want = dict(_PHYSICSNEMO)
        if cfg["variant"] == "plus":
            want["temperature_range"] = None
        if cfg["cond_dim"] is not None:
            raise ValueError("PhysicsNeMo's Transolver has no condition embedding (this model has cond_dim set)")
    if source == "thuml" and cfg["variant"] == "plain" and cfg["cond_dim"] is not None:
        raise ValueError("thuml's Transolver has no condition embedding (this model has cond_dim set)")
    differ = {k: cfg[k] for k, v in want.items() if cfg[k] != v}
    if differ:
        raise ValueError(
            f"the {source} model computes with {want}, this model with {differ}: its weights would give other "
            f"outputs there (build the model with Transolver(..., {', '.join(f'{k}={v}' for k, v in want.items())}))"
        )
    ours = {k: v.detach() for k, v in model.state_dict().items()}
    plus_thuml = source == "thuml" and cfg["variant"] == "plus"
    out = {}
    entries = _entries(source, cfg["n_layers"], cfg["variant"], cfg["cond_dim"] is not None)
    for our_names, ref_names, fwd, _ in entries:
        values = fwd(*(ours[k] for k in our_names))
        values = values if isinstance(values, tuple) else (values,)
        out.update((k, v.clone()) for k, v in zip(ref_names, values))
    if plus_thuml and cfg["cond_dim"] is None:  # the reference always holds its (unused) condition embedding
        p = ours["placeholder"]
        out["embedding.weight"] = p.new_zeros((p.shape[0], 3))
        out["embedding.bias"] = p.new_zeros(p.shape)
    return out
