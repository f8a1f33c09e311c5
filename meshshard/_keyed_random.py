"""Gumbel noise keyed by the global point id: the same draw for a point on any number of ranks.

Transolver++ perturbs the slice logits with Gumbel noise in training. Drawn from a stateful
generator (``torch.rand_like``), each rank would draw numbers for its *local* rows, so a P-rank run
would see other noise than a single process and could not be compared with it. Here every number
is a pure function of ``(key, b, h, point_id, m)``: a counter-based generator. No library offers a
counter-based generator over arbitrary integer keys in PyTorch (``torch.Generator`` is stateful;
Philox is not exposed per element), so it is written here, as 32-bit integer hashing on ``int32``
tensors (wrap-around multiplication; logical shifts by masking), on any device.

The hash is Chris Wellons' *lowbias32* (public-domain constants), applied in a chain:
``a = mix(id_lo ^ key_bh)``, ``a = mix(a ^ id_hi)``, ``u = mix(a ^ key_m)`` with ``key_bh`` and
``key_m`` hashed from the seed and the batch, head and slice indices. The top ``k`` bits ``t``
give ``u = (t + 1/2) / 2**k`` with ``k = min(23, m)``, ``m`` the dtype's mantissa bits (23 for float32 and float64,
10 for float16, 7 for bfloat16), and ``g = -log(-log(u))`` is standard Gumbel.

Why ``k`` depends on the dtype: ``t + 1/2`` needs ``k + 1`` significant bits, so every ``u`` is
exact in the dtype only when ``k <= m``; then ``u`` lies in ``[2**-(k+1), 1 - 2**-(k+1)]``,
strictly inside ``(0, 1)``. With 24 bits in float32 (an earlier version) ``t + 1/2`` rounded to
even, and ``t = 2**24 - 1`` gave ``u = 1.0`` exactly: ``-log(-log(1)) = +inf``, a NaN row in the
softmax, NaN slice tokens and a NaN loss, once in ``2**24`` draws (so almost surely in every
training step from ~20k points with a few heads, slices and layers). float32 and float64 draw
the same ``u`` (23 bits are exact in both).
"""

from __future__ import annotations

import math

import torch

__all__ = ["mix32", "keyed_uniform", "unit_interval", "gumbel_noise", "step_seed"]

_M32 = 0xFFFFFFFF
_C1, _C2 = 0x7FEB352D, 0x846CA68B


def _s32(v: int) -> int:
    """An unsigned 32-bit value as the int32 with the same bits."""
    v &= _M32
    return v - (1 << 32) if v >= 1 << 31 else v


def mix32(x):
    """lowbias32 on unsigned 32-bit values: Python ints, or int32 tensors holding the bits.

    For tensors the arithmetic wraps modulo ``2**32`` (int32), and right shifts are made logical
    by masking, so the bits agree with the Python-int version.
    """
    if isinstance(x, torch.Tensor):
        x = x ^ ((x >> 16) & 0xFFFF)
        x = x * _s32(_C1)
        x = x ^ ((x >> 15) & 0x1FFFF)
        x = x * _s32(_C2)
        return x ^ ((x >> 16) & 0xFFFF)
    x &= _M32
    x ^= x >> 16
    x = (x * _C1) & _M32
    x ^= x >> 15
    x = (x * _C2) & _M32
    return x ^ (x >> 16)


def _key(*values: int) -> int:
    k = 0x9E3779B9
    for v in values:
        v = int(v)
        k = mix32(k ^ (v & _M32))
        k = mix32(k ^ ((v >> 32) & _M32) ^ 0x85EBCA6B)
    return k


def _int32_bits(v: torch.Tensor) -> torch.Tensor:
    """int64 values in ``[0, 2**32)`` as int32 with the same bits."""
    return (v - ((v >> 31) & 1) * (1 << 32)).to(torch.int32)


def _key_tensor(*values) -> torch.Tensor:
    """:func:`_key` on int64 tensors (broadcast together; Python ints allowed): the int32 bits of the same keys.

    A value ``v`` is hashed as its two 32-bit words ``v & 0xFFFFFFFF`` and ``(v >> 32) & 0xFFFFFFFF``,
    as in :func:`_key` (the arithmetic shift of a negative int64 gives the same high word as Python's);
    so every value in ``[-2**63, 2**63)`` gets :func:`_key`'s bits.
    """
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    dev = tensors[0].device if tensors else None
    k = torch.tensor(_s32(0x9E3779B9), dtype=torch.int32, device=dev)
    for v in values:
        v = torch.as_tensor(v, dtype=torch.int64, device=dev)
        k = mix32(k ^ _int32_bits(v & _M32))
        k = mix32(k ^ _int32_bits(((v >> 32) & _M32) ^ 0x85EBCA6B))
    return k


def step_seed(base: int, step: torch.Tensor) -> torch.Tensor:
    """``(base + step) % 2**63`` as a 0-d int64 tensor, without int64 overflow (``0 <= base < 2**63``).

    The traced form of a seed that advances every step (Transolver++'s ``rng_step``): a Python int
    would be a constant of the compiled graph, guarded, and so compile a new graph every step.
    Computed on 32-bit words with the carry, so it equals the Python value for any int64 ``step``.
    """
    lo = (base & _M32) + (step & _M32)
    hi = ((base >> 32) + (step >> 32) + (lo >> 32)) & ((1 << 31) - 1)
    return (hi << 32) | (lo & _M32)


def _slice_keys(seed, batch: int, heads: int, slices: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """The int32 keys ``(B, H)`` of the batch and head and ``(M,)`` of the slice; ``seed`` an int or a 0-d tensor."""
    if isinstance(seed, torch.Tensor):
        b = torch.arange(batch, dtype=torch.int64, device=seed.device).view(-1, 1)
        h = torch.arange(heads, dtype=torch.int64, device=seed.device).view(1, -1)
        m = torch.arange(slices, dtype=torch.int64, device=seed.device)
        return _key_tensor(seed, b, h).to(dev), _key_tensor(seed, -1, m).to(dev)
    key_bh = torch.tensor(
        [[_s32(_key(seed, b, h)) for h in range(heads)] for b in range(batch)], dtype=torch.int32, device=dev
    )
    key_m = torch.tensor([_s32(_key(seed, -1, m)) for m in range(slices)], dtype=torch.int32, device=dev)
    return key_bh, key_m


def keyed_uniform(
    point_ids: torch.Tensor, batch: int, heads: int, slices: int, seed: int | torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Uniform numbers in ``(0, 1)``, ``(batch, heads, N, slices)``, a pure function of the keys.

    Parameters
    ----------
    point_ids:
        ``(N,)`` non-negative integer ids of the points (global ids: the same point has the same
        id on every rank).
    batch, heads, slices:
        The other three dims of the result.
    seed:
        Any integer (the module's seed and the step, combined by the caller), or a 0-d int64 tensor
        holding one (the same numbers; what a compiled graph takes, see :func:`step_seed`).
    dtype:
        Floating dtype of the result (23 random bits; 10 for float16, 7 for bfloat16: see
        :func:`unit_interval`).
    """
    if point_ids.dim() != 1 or point_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"point_ids must be a 1-d integer tensor (got shape {tuple(point_ids.shape)}, dtype {point_ids.dtype})"
        )
    ids = point_ids.to(torch.int64)
    dev = ids.device
    lo, hi = _int32_bits(ids & _M32), _int32_bits((ids >> 32) & _M32)
    key_bh, key_m = _slice_keys(seed, batch, heads, slices, dev)
    a = mix32(lo.view(1, 1, -1) ^ key_bh.unsqueeze(-1))  # (B, H, N)
    a = mix32(a ^ hi.view(1, 1, -1))
    return unit_interval(mix32(a.unsqueeze(-1) ^ key_m), dtype)  # (B, H, N, M)


def unit_interval(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int32 random bits -> numbers strictly inside ``(0, 1)``, every one exact in ``dtype``.

    Uses the top ``k = min(23, m)``, ``m`` the dtype's mantissa bits bits ``t``: ``(t + 1/2) * 2**-k``, which is
    exact in ``dtype`` (``k + 1`` significant bits), hence never rounds to 0 or 1.
    """
    if not dtype.is_floating_point:
        raise TypeError(f"Expected a floating dtype for the uniform numbers (got {dtype})")
    k = min(23, round(-math.log2(torch.finfo(dtype).eps)))  # eps = 2**-(mantissa bits)
    top = (bits >> (32 - k)) & ((1 << k) - 1)
    return (top.to(dtype) + 0.5) * (2.0**-k)


def gumbel_noise(
    point_ids: torch.Tensor, batch: int, heads: int, slices: int, seed: int | torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log(u))`` with ``u`` from :func:`keyed_uniform`; same shape."""
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    u = keyed_uniform(point_ids, batch, heads, slices, seed, work)
    return (-torch.log(-torch.log(u))).to(dtype)


# -- element-wise keyed numbers (the random ops on ShardTensors, ``meshshard/tensor/_rules/_random.py``) --------
# Every number is a pure function of (seed, stream, global element index): independent over elements, and the
# same for a given element on any number of ranks and any partition.
__all__ += ["keyed_bits", "uniform_at", "normal_at"]  # noqa: PLE0605


def keyed_bits(index: torch.Tensor, seed: int, stream: int = 0) -> torch.Tensor:
    """32 random bits (an int32 with those bits) per element of ``index``, a pure function of the keys.

    ``a = mix(id_lo ^ k1)``, ``a = mix(a ^ id_hi)``, ``bits = mix(a ^ k2)`` with ``k1, k2`` hashed from
    ``(seed, stream)``: the chain of :func:`keyed_uniform` with the (batch, head, slice) keys replaced by a stream.

    Parameters
    ----------
    index:
        Non-negative int64 (or int32) element ids of any shape (global ids: the same element has the same id on
        every rank).
    seed, stream:
        Any integers; different streams give independent numbers for the same element.
    """
    ids = index.to(torch.int64)
    lo, hi = _int32_bits(ids & _M32), _int32_bits((ids >> 32) & _M32)
    a = mix32(lo ^ _s32(_key(seed, stream, 0)))
    a = mix32(a ^ hi)
    return mix32(a ^ _s32(_key(seed, stream, 1)))


#: The stored mantissa bits of each floating dtype: ``(t + 1/2) 2**-k`` is exact for ``t`` of ``k`` of them.
_FRACTION_BITS = {torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}


def uniform_at(index: torch.Tensor, seed: int, dtype: torch.dtype, stream: int = 0) -> torch.Tensor:
    """Uniform numbers strictly inside ``(0, 1)``, one per element of ``index``, exact in ``dtype``.

    ``u = (t + 1/2) 2**-k`` with ``t`` the top ``k`` keyed bits and ``k`` the dtype's mantissa bits (52 for
    float64, drawn from two 32-bit words; 23 for float32; 10 for float16; 7 for bfloat16). ``t + 1/2`` has ``k + 1``
    significant bits, so ``u`` is exact in ``dtype``: never 0 or 1, and no two values merged by rounding.
    Uses the streams ``2 stream`` and ``2 stream + 1``.
    """
    if dtype not in _FRACTION_BITS:
        raise TypeError(f"Expected float64, float32, float16 or bfloat16 for uniform numbers (got {dtype})")
    k = _FRACTION_BITS[dtype]
    first = keyed_bits(index, seed, 2 * stream)
    if k <= 31:
        t = ((first >> (32 - k)) & ((1 << k) - 1)).to(torch.int64)
    else:
        low = k - 26  # the top 26 bits of the first word, then k - 26 bits of the second
        second = keyed_bits(index, seed, 2 * stream + 1)
        t = (((first >> 6) & 0x3FFFFFF).to(torch.int64) << low) | ((second >> (32 - low)) & ((1 << low) - 1)).to(
            torch.int64)
    return (t.to(dtype) + 0.5) * (2.0**-k)


def normal_at(index: torch.Tensor, seed: int, dtype: torch.dtype, stream: int = 0) -> torch.Tensor:
    """Standard normal numbers, one per element of ``index`` (Box-Muller on two keyed uniforms).

    ``z = sqrt(-2 log u1) cos(2 pi u2)``, computed in float64 for float64 and in float32 otherwise (then cast), so
    the tails reach ``sqrt(-2 log 2**-53)`` ~ 8.6 standard deviations in float64 and ~ 5.8 in float32. Uses the
    uniform streams ``2 stream`` and ``2 stream + 1``.
    """
    work = torch.float64 if dtype == torch.float64 else torch.float32
    u1 = uniform_at(index, seed, work, 2 * stream)
    u2 = uniform_at(index, seed, work, 2 * stream + 1)
    return (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2 * torch.pi) * u2)).to(dtype)


@torch.library.custom_op("meshshard::seeded_rand", mutates_args=())
def seeded_rand(seed: torch.Tensor, shape: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.rand(shape)`` from a ``torch.Generator`` seeded with ``int(seed)`` (a 0-d int64 tensor).

    The eager draws of a seeded generator, as one opaque op of a compiled graph: dynamo cannot create a
    ``torch.Generator`` inside a graph, and a seed that changes every step must be data (``step_seed``), not a
    guarded Python int. It runs eagerly when the graph runs, so compiled draws equal eager's bit for bit.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return torch.rand(shape, generator=gen, device=device, dtype=dtype)


@seeded_rand.register_fake
def _seeded_rand_fake(seed, shape, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device)
