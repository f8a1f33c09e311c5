"""Grid ops along the sharded dimension through the row halo: convolution, pooling, pad, interpolate, unfold, diff.

A grid ``(B, C, H[, W[, D]])`` (or an ordered sequence of points) sharded along one spatial dim: each
rank computes the result rows it owns from its own rows plus the neighbouring rows fetched with
:mod:`meshshard.tensor._rows` (one ``all_to_all``), and torch's own op runs on that window with no
padding along the sharded dim (the padding there is built explicitly: zeros for a convolution, ``-inf``
for a max pool, mirrored/replicated/wrapped rows for ``F.pad``).

**Who owns a result row.** Result row ``j`` belongs to the rank that owns its *anchor* input row
(clamped into ``[0, N)``), so the result's sharding sizes follow from global shape arithmetic, the
same on every rank, and an empty rank owns no result row:

=============================================  =============================================================
op                                             anchor of result row ``j``
=============================================  =============================================================
conv, max/avg pool, ``F.unfold``,              the centre of the window: ``j s - p_lo + (d (k - 1)) // 2``
``Tensor.unfold``, ``torch.diff``              (a stride-1 'same' convolution keeps the input's sizes)
``F.pad``                                      ``j - pad_before`` (the first rank takes the rows added before,
                                               the last one those added after)
``F.interpolate``                              ``floor(j N / N_out)`` (an upsampling by 2 gives rank ``r``
                                               rows ``2 o_r ... 2 o_{r+1}``)
=============================================  =============================================================

A 2x pooling followed by a 2x upsampling gives back the input's sizes when every rank's offset is even
(a U-Net of depth ``L``: offsets multiples of ``2^L``); otherwise the skip concatenation raises a
:class:`~meshshard.ShardingError` on every rank naming both sizes (reshard one with ``x.reshard``).

Ops along a dim that is not sharded (a batch, the channels of ``F.interpolate``, the other spatial dims)
are local. Indices of ``return_indices=True`` are global (into the single-process input's spatial dims).

**Communication:** each op: one ``all_to_all`` forward of the halo rows (none when no rank needs a row
it does not own) and one backward; nothing else. A convolution sharded along ``H`` with kernel ``k``,
dilation ``d`` sends at most ``d (k - 1) / 2`` rows of ``B C W`` values to each neighbour.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..._sizes import offsets_of
from .._dispatch import bind, no_subclass
from .._dispatch import register_rule as register
from .._rows import fetch_intervals, sizes_by_anchor, window_rows
from .._spec import ShardSpec
from .._tensor import ReplicatedTensor, ShardTensor, wrap_shard
from ._common import local_of, ndim, refuse, sharded_input, wrap

__all__ = ["conv_rows"]


def _tuple(v, n: int) -> tuple:
    if isinstance(v, (list, tuple, torch.Size)):
        v = tuple(v)
        return v * n if len(v) == 1 and n > 1 else v
    return (v,) * n


def _meta(t):
    if isinstance(t, ShardTensor):
        return torch.empty(t._spec.global_shape, dtype=t.dtype, device="meta")
    if isinstance(t, torch.Tensor):
        with no_subclass():
            return torch.empty(t.shape, dtype=t.dtype, device="meta")
    return t


def _probe(func, a: dict):
    """The op on meta tensors of the global shapes: torch's own argument checks and output shape, on every rank."""
    with no_subclass(), torch.no_grad():
        return func(**{k: _meta(v) for k, v in a.items()})


def _spatial_axis(func, x: ShardTensor, k: int, channel_local: bool = False) -> int | None:
    """The sharded spatial axis (0..k-1) of a ``(B, C, *S)`` or ``(C, *S)`` input; ``None``: local."""
    nd, d = ndim(x), x._spec.dim
    if d >= nd - k:
        return d - (nd - k)
    if nd == k + 2 and d == 0 or channel_local:
        return None
    raise refuse(func, "the channel dim is sharded", "shard a batch or spatial dim instead")


def _rank_rows(spec: ShardSpec, sizes) -> tuple[int, int, list[int]]:
    """(first result row of this rank, its count, every rank's first result row)."""
    off = offsets_of(sizes)
    return off[spec.rank], sizes[spec.rank], list(off[:-1])


def _connected(empty: torch.Tensor, d: int, rows: int, fill: float = 0.0) -> torch.Tensor:
    """``rows`` rows of ``fill`` after ``empty`` (no rows along ``d``), in its autograd graph.

    A rank with no result rows still runs the op on such a dummy so that its (empty) result hangs off the
    halo exchange and the weights: every rank then joins the exchange's backward."""
    shape = list(empty.shape)
    shape[d] = rows
    return torch.cat([empty.narrow(d, 0, 0), empty.new_full(shape, fill)], d)


def _windowed(x: ShardTensor, sizes, stride: int, start: int, span: int, fill: float | None):
    """The input rows of this rank's result rows ``j`` (windows ``[j stride + start, j stride + start + span)``).

    Returns ``(window, count)``; an empty count gives one window of ``span`` fill rows (run the op on it
    and keep none of its result), still in the graph.
    """
    spec = x._spec
    j0, cnt, firsts = _rank_rows(spec, sizes)
    lo = [f * stride + start for f in firsts]
    hi = [lo[r] + ((sizes[r] - 1) * stride + span if sizes[r] else 0) for r in range(spec.num_ranks)]
    local = x.to_local()
    with no_subclass():
        win = window_rows(local, spec, lo, hi, fill)
        if cnt == 0:
            win = _connected(win, spec.dim, span, 0.0 if fill is None else fill)
    return win, cnt


def _result(out: torch.Tensor, x: ShardTensor, dim: int, sizes, global_shape, cnt: int):
    with no_subclass():
        if cnt == 0:
            out = out.narrow(dim, 0, 0)
    return wrap_shard(out, x._spec.resized(dim, sizes, global_shape))


def _window_sizes(x: ShardTensor, n_out: int, stride: int, start: int, span: int):
    return sizes_by_anchor(x._spec, n_out, lambda j: j * stride + start + (span - 1) // 2)


# -- convolution ------------------------------------------------------------------------------------
def _conv_padding(padding, weight_shape, dilation, k: int) -> tuple[list[int], list[int]]:
    if padding == "valid":
        return [0] * k, [0] * k
    if padding == "same":
        total = [dilation[i] * (weight_shape[2 + i] - 1) for i in range(k)]
        return [t // 2 for t in total], [t - t // 2 for t in total]
    p = list(_tuple(padding, k))
    return p, p


def conv_rows(func, a: dict, x: ShardTensor, k: int, ax: int):
    """``conv{k}d`` of ``x`` sharded along spatial axis ``ax``: the halo window, then torch's conv on it."""
    spec = x._spec
    out_meta = _probe(func, a)
    weight = a["weight"]
    stride, dilation = list(_tuple(a["stride"], k)), list(_tuple(a["dilation"], k))
    plo, phi = _conv_padding(a["padding"], weight.shape, dilation, k)
    span = dilation[ax] * (weight.shape[2 + ax] - 1) + 1
    n_out = out_meta.shape[spec.dim]
    sizes = _window_sizes(x, n_out, stride[ax], -plo[ax], span)
    win, cnt = _windowed(x, sizes, stride[ax], -plo[ax], span, 0.0)
    plo[ax] = phi[ax] = 0
    with no_subclass():
        if plo != phi:  # 'same' with an even kernel on another axis: pad it explicitly
            pads = []
            for i in reversed(range(k)):
                pads += [plo[i], phi[i]]
            win, plo = F.pad(win, pads), [0] * k
        out = func(win, local_of(weight), local_of(a["bias"]), stride, plo, dilation, a["groups"])
    return _result(out, x, spec.dim, sizes, out_meta.shape, cnt)


# -- pooling ----------------------------------------------------------------------------------------
_MAX = {1: (F.max_pool1d, F.max_pool1d_with_indices), 2: (F.max_pool2d, F.max_pool2d_with_indices),
        3: (F.max_pool3d, F.max_pool3d_with_indices)}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _pool_args(a: dict, k: int):
    kernel = list(_tuple(a["kernel_size"], k))
    stride = a["stride"]
    stride = kernel if stride is None or (isinstance(stride, (list, tuple)) and not stride) else list(_tuple(stride, k))
    return kernel, stride, list(_tuple(a["padding"], k))


def _global_indices(idx: torch.Tensor, local_spatial, global_spatial, ax: int, start: int, dil: int):
    """Flat indices into a local window's spatial dims -> flat indices into the global input's."""
    rem, coords = idx, []
    for size in reversed(local_spatial):
        coords.append(rem % size)
        rem = rem // size
    coords.reverse()
    row = coords[ax] + start
    # torch's max pool starts from the first real row of a window: a window whose real values are all
    # -inf keeps that row, where the local window (explicit -inf rows) would keep a padding row
    row = torch.where(row < 0, row + (-row + dil - 1) // dil * dil, row)
    coords[ax] = row
    flat = torch.zeros_like(idx)
    for c, size in zip(coords, global_spatial):
        flat = flat * size + c
    return flat


def max_pool_rows(func, a: dict, x: ShardTensor, k: int, ax: int, with_indices: bool):
    spec = x._spec
    probe_a = dict(a)
    out_meta = _probe(_MAX[k][1], probe_a)[0]
    kernel, stride, padding = _pool_args(a, k)
    dilation = list(_tuple(a["dilation"], k))
    span = dilation[ax] * (kernel[ax] - 1) + 1
    n_out = out_meta.shape[spec.dim]
    sizes = _window_sizes(x, n_out, stride[ax], -padding[ax], span)
    pad_ax = padding[ax]
    win, cnt = _windowed(x, sizes, stride[ax], -pad_ax, span, -math.inf)
    padding[ax] = 0
    with no_subclass():
        out, idx = _MAX[k][1](win, kernel, stride, padding, dilation, a["ceil_mode"])
    values = _result(out, x, spec.dim, sizes, out_meta.shape, cnt)
    if not with_indices:
        return values
    nd = ndim(x)
    g_spatial = list(spec.global_shape[nd - k :])
    with no_subclass():
        l_spatial = list(win.shape[nd - k :])
        j0 = offsets_of(sizes)[spec.rank]
        idx = _global_indices(idx, l_spatial, g_spatial, ax, j0 * stride[ax] - pad_ax, dilation[ax])
    return values, _result(idx, x, spec.dim, sizes, out_meta.shape, cnt)


def _avg_divisor(n: int, n_out: int, kernel: int, stride: int, pad: int, include_pad: bool) -> torch.Tensor:
    """torch's divisor along one axis for every result row (``avg_pool``'s kernels multiply the axes')."""
    hs = torch.arange(n_out, dtype=torch.long) * stride - pad
    he = torch.clamp(hs + kernel, max=n + pad)
    if include_pad:
        return he - hs
    return torch.clamp(he, max=n) - torch.clamp(hs, min=0)


def avg_pool_rows(func, a: dict, x: ShardTensor, k: int, ax: int):
    spec = x._spec
    out_meta = _probe(_AVG[k], a)
    kernel, stride, padding = _pool_args(a, k)
    n_out = out_meta.shape[spec.dim]
    pad_ax = padding[ax]
    sizes = _window_sizes(x, n_out, stride[ax], -pad_ax, kernel[ax])
    win, cnt = _windowed(x, sizes, stride[ax], -pad_ax, kernel[ax], 0.0)
    padding[ax] = 0
    extra = {} if k == 1 else {"divisor_override": a.get("divisor_override")}
    with no_subclass():
        out = _AVG[k](win, kernel, stride, padding, a["ceil_mode"], a["count_include_pad"], **extra)
        if extra.get("divisor_override") is None and cnt:
            j0 = offsets_of(sizes)[spec.rank]
            true = _avg_divisor(spec.num_global, n_out, kernel[ax], stride[ax], pad_ax,
                                bool(a["count_include_pad"]))[j0 : j0 + cnt]
            if bool((true != kernel[ax]).any()):  # the local window divided by the full kernel
                shape = [1] * out.dim()
                shape[spec.dim] = cnt
                out = out * (kernel[ax] / true.to(out.dtype if out.is_floating_point() else torch.float64)).to(
                    out.device).reshape(shape).to(out.dtype)
    return _result(out, x, spec.dim, sizes, out_meta.shape, cnt)


_MAX_FUNCS = {
    F.max_pool1d: 1, F.max_pool1d_with_indices: 1, torch.max_pool1d: 1, torch.max_pool1d_with_indices: 1,
    F.max_pool2d: 2, F.max_pool2d_with_indices: 2, torch.max_pool2d: 2, torch._C._nn.max_pool2d_with_indices: 2,
    F.max_pool3d: 3, F.max_pool3d_with_indices: 3, torch.max_pool3d: 3, torch._C._nn.max_pool3d_with_indices: 3,
}
_RETURNS_INDICES = {F.max_pool1d_with_indices, torch.max_pool1d_with_indices, F.max_pool2d_with_indices,
                    torch._C._nn.max_pool2d_with_indices, F.max_pool3d_with_indices,
                    torch._C._nn.max_pool3d_with_indices}


@register(*[f for f, k in _MAX_FUNCS.items() if k > 1])
def _max_pool_nd(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                  "return_indices"), {"padding": 0, "dilation": 1, "ceil_mode": False,
                                                      "return_indices": False})
    return max_pool(func, a, _MAX_FUNCS[func])


def max_pool(func, a: dict, k: int):
    """Max pooling (``k``-d) of a ShardTensor: local along a batch, through the halo along a spatial dim."""
    x = sharded_input(func, a["input"])
    idx = bool(a.pop("return_indices", False)) or func in _RETURNS_INDICES
    ax = _spatial_axis(func, x, k)
    if ax is None:
        with no_subclass():
            out = _MAX[k][1](local_of(x), a["kernel_size"], a["stride"], a["padding"], a["dilation"], a["ceil_mode"])
        return wrap(out if idx else out[0], x._spec, 0)
    return max_pool_rows(func, a, x, k, ax, idx)


_AVG_FUNCS = {torch.avg_pool1d: 1, F.avg_pool2d: 2, F.avg_pool3d: 3}


@register(F.avg_pool2d, F.avg_pool3d)
def _avg_pool_nd(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                                  "divisor_override"),
             {"padding": 0, "ceil_mode": False, "count_include_pad": True})
    return avg_pool(func, a, _AVG_FUNCS[func])


def avg_pool(func, a: dict, k: int):
    """Average pooling (``k``-d): local along a batch, through the halo along a spatial dim."""
    x = sharded_input(func, a["input"])
    ax = _spatial_axis(func, x, k)
    if ax is None:
        with no_subclass():
            out = _AVG[k](**{key: local_of(v) for key, v in a.items()})
        return wrap(out, x._spec, 0)
    return avg_pool_rows(func, a, x, k, ax)


# -- F.pad --------------------------------------------------------------------------------------------
def _runs(rows: torch.Tensor) -> list[tuple[int, int]]:
    """Sorted unique rows -> half-open intervals of consecutive rows."""
    if rows.numel() == 0:
        return []
    breaks = (torch.nonzero(rows[1:] != rows[:-1] + 1).reshape(-1) + 1).tolist()
    starts = [0, *breaks]
    ends = [*breaks, rows.numel()]
    return [(int(rows[s]), int(rows[e - 1]) + 1) for s, e in zip(starts, ends)]


def _pad_source(i: torch.Tensor, before: int, n: int, mode: str) -> torch.Tensor:
    src = i - before
    if mode == "reflect":
        src = src.abs()
        return torch.where(src > n - 1, 2 * (n - 1) - src, src)
    if mode == "replicate":
        return src.clamp(0, n - 1)
    return src % n  # circular


@register(F.pad, torch._C._nn.pad, torch.constant_pad_nd)
def _pad(func, args, kwargs):
    """``F.pad``: the other dims locally; the sharded dim through the halo (the first rank owns the rows
    added before, the last non-empty rank those added after; ``reflect``/``replicate``/``circular`` rows
    come from their owners)."""
    if func is torch.constant_pad_nd:
        a = bind(func, args, kwargs, ("input", "pad", "value"), {"value": 0})
        a["mode"] = "constant"
    else:
        a = bind(func, args, kwargs, ("input", "pad", "mode", "value"), {"mode": "constant"})
        a["mode"] = a["mode"] or "constant"
    x = sharded_input(func, a["input"])
    spec = x._spec
    mode = a["mode"]
    pad = [int(p) for p in a["pad"]]
    out_meta = _probe(F.pad, {"input": x, "pad": pad, "mode": mode, "value": a["value"]})
    d, n = spec.dim, spec.num_global
    back = ndim(x) - 1 - d
    before, after = (pad[2 * back], pad[2 * back + 1]) if len(pad) > 2 * back else (0, 0)
    others = list(pad)
    if len(pad) > 2 * back:
        others[2 * back] = others[2 * back + 1] = 0
    local = x.to_local()
    if before == 0 and after == 0:
        sizes, rows, cnt = spec.sizes, local, spec.sizes[spec.rank]
    else:
        n_out = out_meta.shape[d]
        sizes = sizes_by_anchor(spec, n_out, lambda i: i - before)
        j0, cnt, firsts = _rank_rows(spec, sizes)
        with no_subclass():
            if mode == "constant":
                lo = [f - before for f in firsts]
                hi = [lo[r] + sizes[r] for r in range(spec.num_ranks)]
                value = 0.0 if a["value"] is None else a["value"]
                rows = window_rows(local, spec, lo, hi, value)
            else:
                srcs = [_pad_source(torch.arange(f, f + s), before, n, mode) for f, s in zip(firsts, sizes)]
                uniq = [torch.unique(s) for s in srcs]
                fetched = fetch_intervals(local, spec, [_runs(u) for u in uniq])
                pos = torch.searchsorted(uniq[spec.rank], srcs[spec.rank]).to(local.device)
                rows = fetched.index_select(d, pos)
    with no_subclass():
        empty = cnt == 0
        if any(others):
            if empty:
                rows = _connected(rows, d, 1)
            rows = F.pad(rows, others, mode, a["value"]) if mode != "constant" else F.pad(rows, others, "constant",
                                                                                          a["value"])
            if empty:
                rows = rows.narrow(d, 0, 0)
        elif empty:
            rows = rows.narrow(d, 0, 0) if rows.shape[d] else rows
    if tuple(rows.shape[:d]) + tuple(rows.shape[d + 1:]) != tuple(out_meta.shape[:d]) + tuple(out_meta.shape[d + 1:]):
        raise RuntimeError(f"internal: F.pad result {tuple(rows.shape)} does not match {tuple(out_meta.shape)}")
    return wrap_shard(rows, spec.resized(d, sizes, out_meta.shape))


# -- F.interpolate ------------------------------------------------------------------------------------
_LINEAR = {"linear", "bilinear", "trilinear"}


def _linear_source(n_in: int, n_out: int, j: torch.Tensor, align_corners: bool, scale, dtype):
    """torch's source index pair and weights of linear interpolation along one axis (``area_pixel_compute_*``)."""
    opmath = torch.float64 if dtype == torch.float64 else torch.float32
    if align_corners:
        s = torch.tensor(n_in - 1, dtype=opmath) / (n_out - 1) if n_out > 1 else torch.tensor(0.0, dtype=opmath)
        real = s * j.to(opmath)
    else:
        s = torch.tensor(1.0 / scale, dtype=opmath) if scale is not None and scale > 0 else (
            torch.tensor(n_in, dtype=opmath) / n_out)
        real = (s * (j.to(opmath) + 0.5) - 0.5).clamp(min=0)
    i0 = torch.clamp(torch.floor(real).to(torch.long), max=n_in - 1)
    lam = torch.clamp(real - i0.to(opmath), 0, 1)
    i1 = i0 + (i0 < n_in - 1).to(torch.long)
    return i0, i1, lam


@register(F.interpolate)
def _interpolate(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "size", "scale_factor", "mode", "align_corners",
                                  "recompute_scale_factor", "antialias"), {"mode": "nearest", "antialias": False})
    x = sharded_input(func, a["input"])
    spec = x._spec
    nd, d, mode = ndim(x), spec.dim, a["mode"]
    out_meta = _probe(func, a)
    k = nd - 2
    if d < 2:  # batch or channels: local (torch refuses no channels: an empty shard runs on one zero channel)
        local = x.to_local()
        with no_subclass():
            empty = local.shape[d] == 0
            out = func(**{**a, "input": _connected(local, d, 1) if empty else local})
            if empty:
                out = out.narrow(d, 0, 0)
        return wrap(out, spec, d)
    ax = d - 2
    if mode not in ("nearest", "nearest-exact", *_LINEAR) or a["antialias"]:
        raise refuse(func, f"mode {mode!r}{' with antialias' if a['antialias'] else ''} along the sharded dim",
                     "use nearest, nearest-exact, linear, bilinear or trilinear")
    n, n_out = spec.num_global, out_meta.shape[d]
    sf = a["scale_factor"]
    sf_ax = None if sf is None else _tuple(sf, k)[ax]
    scale_used = sf_ax if (sf_ax is not None and not a["recompute_scale_factor"]) else None
    sizes = sizes_by_anchor(spec, n_out, lambda j: j * n // n_out)
    j0, cnt, firsts = _rank_rows(spec, sizes)
    local = x.to_local()
    with no_subclass():
        if mode in _LINEAR:
            per = [_linear_source(n, n_out, torch.arange(f, f + s), bool(a["align_corners"]), scale_used, x.dtype)
                   for f, s in zip(firsts, sizes)]
            need = [[(int(i0.min()), int(i1.max()) + 1)] if i0.numel() else [] for i0, i1, _ in per]
        else:
            probe = torch.arange(n, dtype=torch.float64, device=local.device).reshape(1, 1, n)
            idx = F.interpolate(probe, size=None if sf_ax is not None else n_out, scale_factor=sf_ax, mode=mode,
                                recompute_scale_factor=a["recompute_scale_factor"]).reshape(-1).long().cpu()
            per = [idx[f : f + s] for f, s in zip(firsts, sizes)]
            need = [[(int(i.min()), int(i.max()) + 1)] if i.numel() else [] for i in per]
        rows = fetch_intervals(local, spec, need)
        base = need[spec.rank][0][0] if need[spec.rank] else 0
        if mode in _LINEAR:
            i0, i1, lam = per[spec.rank]
            shape = [1] * nd
            shape[d] = cnt
            lam = lam.to(device=local.device, dtype=local.dtype).reshape(shape)
            r0 = rows.index_select(d, (i0 - base).to(local.device))
            r1 = rows.index_select(d, (i1 - base).to(local.device))
            rows = r0 * (1 - lam) + r1 * lam
        else:
            rows = rows.index_select(d, (per[spec.rank] - base).to(local.device))
        if k > 1 or any(out_meta.shape[2 + i] != spec.global_shape[2 + i] for i in range(k) if i != ax):
            if cnt == 0:
                rows = _connected(rows, d, 1)
            kw = dict(mode=mode, antialias=False)
            if mode in _LINEAR:
                kw["align_corners"] = a["align_corners"]
            if sf is not None:
                factors = list(_tuple(sf, k))
                factors[ax] = 1.0
                kw.update(scale_factor=factors, recompute_scale_factor=a["recompute_scale_factor"])
            else:
                size = list(out_meta.shape[2:])
                size[ax] = rows.shape[d]
                kw["size"] = size
            rows = F.interpolate(rows, **kw)
            if cnt == 0:
                rows = rows.narrow(d, 0, 0)
    return wrap_shard(rows, spec.resized(d, sizes, out_meta.shape))


# -- unfold and diff ----------------------------------------------------------------------------------
@register(torch.Tensor.unfold)
def _tensor_unfold(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dimension", "size", "step"))
    x = sharded_input(func, a["input"])
    spec = x._spec
    nd = ndim(x)
    with no_subclass(), torch.no_grad():
        out_meta = _meta(x).unfold(a["dimension"], a["size"], a["step"])
    dim = int(a["dimension"]) % max(nd, 1)
    local = x.to_local()
    if dim != spec.dim:
        with no_subclass():
            out = local.unfold(dim, a["size"], a["step"])
        return wrap(out, spec, spec.dim)
    size, step = int(a["size"]), int(a["step"])
    n_out = out_meta.shape[dim]
    sizes = _window_sizes(x, n_out, step, 0, size)
    win, cnt = _windowed(x, sizes, step, 0, size, None)
    with no_subclass():
        out = win.unfold(dim, size, step)
    return _result(out, x, dim, sizes, out_meta.shape, cnt)


@register(F.unfold)
def _f_unfold(func, args, kwargs):
    """``F.unfold`` (im2col) of ``(B, C, H, W)`` sharded along ``H``: the result's columns ``(h, w)`` are
    sharded by output row (``sizes * W_out``)."""
    a = bind(func, args, kwargs, ("input", "kernel_size", "dilation", "padding", "stride"),
             {"dilation": 1, "padding": 0, "stride": 1})
    x = sharded_input(func, a["input"])
    spec = x._spec
    nd = ndim(x)
    out_meta = _probe(func, a)
    batched = nd == 4
    if batched and spec.dim == 0:
        with no_subclass():
            out = func(**{key: local_of(v) for key, v in a.items()})
        return wrap(out, spec, 0)
    if spec.dim != nd - 2:
        raise refuse(func, f"sharded along dim {spec.dim}: the result's columns would interleave ranks",
                     "shard the rows H (dim -2) or the batch")
    kernel, dil = _tuple(a["kernel_size"], 2), _tuple(a["dilation"], 2)
    pad, stride = _tuple(a["padding"], 2), _tuple(a["stride"], 2)
    span = dil[0] * (kernel[0] - 1) + 1
    w_out = (spec.global_shape[-1] + 2 * pad[1] - dil[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    n_out = out_meta.shape[-1] // w_out if w_out else 0
    sizes = _window_sizes(x, n_out, stride[0], -pad[0], span)
    win, cnt = _windowed(x, sizes, stride[0], -pad[0], span, 0.0)
    with no_subclass():
        out = F.unfold(win, kernel, dil, (0, pad[1]), stride)
    return _result(out, x, out.dim() - 1, tuple(s * w_out for s in sizes), out_meta.shape, cnt)


@register(torch.diff, torch.Tensor.diff)
def _diff(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "n", "dim", "prepend", "append"), {"n": 1, "dim": -1})
    x = sharded_input(func, a["input"])
    spec = x._spec
    nd = ndim(x)
    with no_subclass(), torch.no_grad():
        out_meta = torch.diff(_meta(x), a["n"], a["dim"], _meta(a["prepend"]), _meta(a["append"]))
    dim = int(a["dim"]) % max(nd, 1)
    ends = [a["prepend"], a["append"]]
    if int(a["n"]) == 0:  # torch returns a copy of the input and leaves prepend/append out
        with no_subclass():
            out = torch.diff(x.to_local(), 0, dim)
        return wrap(out, spec, spec.dim)
    if dim != spec.dim:
        for e in ends:
            if e is not None and not (isinstance(e, ShardTensor) and e._spec.same_sharding(spec)
                                      and e._spec.dim == spec.dim):
                raise refuse(func, "prepend/append must be ShardTensors sharded like the input along another dim")
        with no_subclass():
            out = torch.diff(x.to_local(), a["n"], dim, local_of(ends[0]), local_of(ends[1]))
        return wrap(out, spec, spec.dim)
    if any(isinstance(e, ShardTensor) for e in ends):
        raise refuse(func, "prepend/append along the sharded dim must be plain tensors (the same on every rank)")
    ends = [e.to_plain() if isinstance(e, ReplicatedTensor) else e for e in ends]
    n_diff = int(a["n"])
    n_pre = 0 if ends[0] is None else ends[0].shape[dim]
    n_x = spec.num_global
    n_out = out_meta.shape[dim]
    sizes = sizes_by_anchor(spec, n_out, lambda j: j + n_diff // 2 - n_pre)
    j0, cnt, firsts = _rank_rows(spec, sizes)
    lo = [min(max(f - n_pre, 0), n_x) for f in firsts]
    hi = [max(min(f + (s + n_diff if s else 0) - n_pre, n_x), lo_) for f, s, lo_ in zip(firsts, sizes, lo)]
    local = x.to_local()
    with no_subclass():
        mid = window_rows(local, spec, lo, hi, None)
        # prepend/append rows join where they fall; elsewhere an empty slice keeps them in the graph, so every
        # rank has a (possibly zero) gradient for them
        a0, b0 = j0, j0 + (cnt + n_diff if cnt else 0)  # the window in the sequence cat(prepend, x, append)
        pre = app = None
        if ends[0] is not None:
            pre = ends[0].narrow(dim, min(a0, n_pre), max(min(b0, n_pre) - a0, 0))
        if ends[1] is not None:
            start = min(max(a0 - n_pre - n_x, 0), ends[1].shape[dim])
            app = ends[1].narrow(dim, start, max(b0 - n_pre - n_x - start, 0))
        parts = [p.to(mid.device) for p in (pre, mid, app) if p is not None]
        win = torch.cat(parts, dim) if len(parts) > 1 else mid
        out = torch.diff(win, n_diff, dim) if cnt else win.narrow(dim, 0, 0)
    return wrap_shard(out, spec.resized(dim, sizes, out_meta.shape))


# -- adaptive pooling with an output size along the sharded axis -----------------------------------
_ADAPTIVE = {F.adaptive_avg_pool2d: (2, "avg"), F.adaptive_avg_pool3d: (3, "avg"),
             F.adaptive_max_pool2d: (2, "max"), F.adaptive_max_pool3d: (3, "max"),
             F._adaptive_max_pool2d: (2, "max"), F._adaptive_max_pool3d: (3, "max"),
             F.adaptive_max_pool2d_with_indices: (2, "max"), F.adaptive_max_pool3d_with_indices: (3, "max")}
_ADAPTIVE_MAX = {2: F.adaptive_max_pool2d_with_indices, 3: F.adaptive_max_pool3d_with_indices}


def _adaptive_windows(n: int, n_out: int) -> tuple[list[int], list[int]]:
    """torch's adaptive windows along one axis: output ``j`` pools ``[floor(j n / o), ceil((j + 1) n / o))``."""
    starts = [(j * n) // n_out for j in range(n_out)]
    ends = [-((-(j + 1) * n) // n_out) for j in range(n_out)]
    return starts, ends


@register(*_ADAPTIVE)
def _adaptive_pool(func, args, kwargs):
    """Adaptive average/max pooling, local along a batch or the channels; along the sharded spatial axis, output
    row ``j`` pools input rows ``[floor(j N / O), ceil((j + 1) N / O))`` (owned by the owner of the window's
    centre row).

    The other spatial axes are pooled by torch on the fetched rows (output size there as asked, the
    sharded axis left as it is), then each output row reduces its rows: a mean of equal-count row means
    (the window's mean) or a max of row maxima; indices are global flat indices, as torch's.

    **Communication:** one ``all_to_all`` of the window rows this rank does not own (forward), one backward.
    """
    k, kind = _ADAPTIVE[func]
    names = ("input", "output_size", "return_indices") if kind == "max" else ("input", "output_size")
    a = bind(func, args, kwargs, names, {"return_indices": False})
    x = sharded_input(func, a["input"])
    with_idx = bool(a.get("return_indices")) or func in (F.adaptive_max_pool2d_with_indices,
                                                         F.adaptive_max_pool3d_with_indices)
    op = _ADAPTIVE_MAX[k] if kind == "max" else func
    probe = _probe(op, {"input": x, "output_size": a["output_size"]})
    ax = _spatial_axis(func, x, k, channel_local=True)
    if ax is None:
        with no_subclass():
            if x._spec.sizes[x._spec.rank] == 0:  # torch refuses empty channels, even on meta
                out = _empty_adaptive(x.to_local(), probe, k, kind)
            else:
                out = op(local_of(x), a["output_size"])
        return wrap(out if with_idx or kind == "avg" else out[0], x._spec, x._spec.dim)
    out, idx = _adaptive_rows(op, x, k, ax, kind, probe)
    return (out, idx) if with_idx else out


def _empty_adaptive(local: torch.Tensor, probe, k: int, kind: str):
    """An empty rank's result (no channels or batch rows here), in the input's graph."""
    shape = list(local.shape)
    shape[-k:] = list((probe[0] if kind == "max" else probe).shape[-k:])
    out = local.new_zeros(shape) + local.sum()
    return (out, torch.zeros(shape, dtype=torch.long)) if kind == "max" else out


def _adaptive_rows(op, x: ShardTensor, k: int, ax: int, kind: str, probe):
    spec, d = x._spec, x._spec.dim
    out_shape = probe[0].shape if kind == "max" else probe.shape
    starts, ends = _adaptive_windows(spec.num_global, out_shape[d])
    centres = torch.tensor([(s + e - 1) // 2 for s, e in zip(starts, ends)], dtype=torch.long)
    sizes = sizes_by_anchor(spec, out_shape[d], lambda j: centres[j])
    firsts = offsets_of(sizes)
    lo = [starts[firsts[r]] if sizes[r] else 0 for r in range(spec.num_ranks)]
    hi = [ends[firsts[r + 1] - 1] if sizes[r] else 0 for r in range(spec.num_ranks)]
    j0, cnt, me = firsts[spec.rank], sizes[spec.rank], spec.rank
    with no_subclass():
        win = window_rows(x.to_local(), spec, lo, hi, None)
        if cnt == 0:
            win = _connected(win, d, 1)
        other = list(out_shape[-k:])
        other[ax] = win.shape[d]
        pooled = op(win, other)
        idx = None
        if kind == "max":
            pooled, idx = pooled
            nd = win.dim()
            idx = _global_indices(idx, list(win.shape[nd - k:]), list(spec.global_shape[nd - k:]), ax, lo[me], 1)
        rows, picks = [], []
        for j in range(j0, j0 + cnt) if cnt else [None]:
            span = (starts[j] - lo[me], ends[j] - starts[j]) if j is not None else (0, pooled.shape[d])
            part = pooled.narrow(d, *span)
            if kind == "avg":
                rows.append(part.mean(d, keepdim=True))
                continue
            best = part.max(d, keepdim=True)
            rows.append(best.values)
            picks.append(idx.narrow(d, *span).gather(d, best.indices))
        out = _result(torch.cat(rows, d), x, d, sizes, out_shape, cnt)
    return out, (_result(torch.cat(picks, d), x, d, sizes, out_shape, cnt) if picks else None)
