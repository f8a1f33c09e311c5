"""``ShardTensor``: a tensor sharded unevenly along one dimension, with its sharding sizes.

Design
------
A :class:`ShardTensor` holds its local shard: a ``torch.Tensor`` subclass (made with
``as_subclass``, no copy) whose storage and autograd node are the local shard's, plus a frozen
:class:`ShardSpec` (device mesh and mesh axis, shard dimension, every rank's local length — the
*sharding sizes* — and the global shape). Ops are intercepted with ``__torch_function__`` and routed
through the registry of sharding rules (:mod:`meshshard.tensor._rules`): local ops run on the shard,
reductions over the sharded dimension become all-reduces, ops that need other ranks' rows move them
with one ``all_to_all``, anything without a rule raises :class:`~meshshard.errors.UnsupportedOpError`.

**Shapes are global**, as in DTensor: ``x.shape``, ``x.size()``, ``len(x)``, ``x.numel()`` and
``x.dim()`` describe the whole tensor on every rank; ``x.local_shape`` and ``x.to_local()`` give this
rank's shard. A rule can take the same decision on every rank only if everything it looks at is the
same on every rank, so an empty or one-point rank never decides differently, and shape arithmetic
such as ``loss.sum() / y.shape[0]`` is right. ``view``/``reshape`` map global target shapes onto
the local shard, so ``B, N, C = x.shape; x.view(B, N, H, D)`` works unchanged.

Gradients (see :mod:`meshshard.comm`): a sharded tensor's gradient is exact on the rank that owns
each row; a replicated value's (a reduction's result, a parameter) is *partial* on each rank. Every
way into autograd accounts for it — ``loss.backward()``, ``loss.backward(g)``,
``torch.autograd.backward`` and ``torch.autograd.grad`` seed a replicated output with ``g / P``;
``torch.autograd.grad`` sums the gradients of non-sharded inputs over the group, so it returns the
single-process gradients; parameters' ``.grad`` are summed by :func:`meshshard.nn.sync_gradients`.

Why not subclass ``DTensor``: with uneven shards PyTorch 2.13's ``DTensor`` returned silently
wrong ``full_tensor()``/``mean()`` here and raised in backward, and its sharding propagation runs at
the ATen level after ``linear``/``layer_norm``/``softmax`` have been decomposed, where the point
dimension of a point cloud is no longer visible. Working at the ``torch`` function level keeps
rules short, lets autograd run on the real local tensors (exact gradients, no wrapper graph), and
costs a dictionary lookup per op. Replicated ``DTensor`` weights take part through their local value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .. import comm, faults
from .._lazy import if_imported
from .._sizes import offsets_of
from ..device_mesh import axis_group_rank
from ..errors import ShardingError, UnsupportedOpError
from ..partition import Partition
from ._compile import inspected_by_compiler, register_method_binding, traced_dunder, tracing
from ._dispatch import bind, dispatch, op_name
from ._spec import ShardSpec, as_sizes, norm_mesh_dim

__all__ = ["ShardTensor", "ReplicatedTensor", "scatter", "validate_enabled"]


validate_enabled = comm.validate_enabled  # the one switch, shared with the collectives


class ShardTensor(torch.Tensor):
    """A tensor sharded (unevenly) along one dimension over one axis of a device mesh.

    Build one with :meth:`from_local` or :func:`scatter`. It behaves like the global tensor: ``x.shape``,
    ``len(x)`` and ``x.numel()`` are global, indices are global, reductions over the sharded dimension
    are all-reduced; the data of this rank is ``x.to_local()``.

    **Shapes:** global ``(..., N_global, ...)`` with ``N_global = sum(sharding_sizes)`` (``x.shape``);
    local ``(..., N_local, ...)`` with ``N_local = sharding_sizes[rank]`` (``x.local_shape``).
    """

    _spec: ShardSpec
    # torch.compile: every local dimension is static. The local length is sizes[rank], a Python int of the
    # spec that the graph is specialised on (and guarded by), so a symbolic one would only contradict it.
    _dynamo_static_indices = frozenset(range(64))

    @staticmethod
    def from_local(
        local: torch.Tensor,
        mesh: DeviceMesh,
        sizes: Sequence[int] | torch.Tensor | None = None,
        dim: int = 0,
        *,
        mesh_dim: int | str | None = None,
        validate: bool | None = None,
    ) -> ShardTensor:
        """Wrap this rank's shard.

        Parameters
        ----------
        local:
            This rank's shard (any shape with ``ndim > dim``); kept, not copied; autograd flows
            through to it.
        mesh:
            The device mesh; the shards live on its axis ``mesh_dim`` (default: the last axis).
        sizes:
            Every rank's local length along ``dim``. Given: **no communication**. ``None``: one
            small all-gather of the local lengths.
        dim:
            The sharded dimension (0: points; 1 with a leading batch dimension).
        validate:
            Check with one all-gather that every rank passed the same ``sizes``
            (default: ``MESHSHARD_VALIDATE``); a mismatch raises :class:`ShardingError`.

        **Communication:** none when ``sizes`` is given (one ``all_gather`` of one int64 when
        validating); one ``all_gather`` of one int64 per rank otherwise.
        """
        if isinstance(local, ShardTensor):
            raise TypeError("from_local expects a plain torch.Tensor (got a ShardTensor); use it as it is")
        if not isinstance(local, torch.Tensor):
            raise TypeError(f"Expected 'local' to be a torch.Tensor (got {type(local).__name__})")
        if not isinstance(mesh, DeviceMesh):
            raise TypeError(f"Expected 'mesh' to be a DeviceMesh (got {type(mesh).__name__})")
        if local.dim() == 0:
            raise ValueError("local must have at least one dimension to shard (got a 0-d tensor)")
        if not -local.dim() <= dim < local.dim():
            raise ValueError(
                f"dim must be in [-{local.dim()}, {local.dim()}) for a {local.dim()}-d local tensor (got {dim})"
            )
        dim %= local.dim()
        mdim = norm_mesh_dim(mesh, mesh_dim)
        group, rank = axis_group_rank(mesh, mdim)
        world = mesh.size(mdim)
        n_local = local.shape[dim]
        if sizes is None:
            sizes_t = comm.all_gather_object_sizes(n_local, group, device=local.device)
        else:
            sizes_t = as_sizes(sizes, "sizes")
            if len(sizes_t) != world:
                raise ValueError(
                    f"sizes must have one entry per rank of mesh axis {mdim} ({world}) (got {len(sizes_t)}: {sizes_t})"
                )
            if sizes_t[rank] != n_local:
                raise ValueError(
                    f"[rank {rank}] sizes[{rank}] = {sizes_t[rank]} but the local tensor has {n_local} "
                    f"entries along dim {dim} (shape {tuple(local.shape)})"
                )
            if validate if validate is not None else validate_enabled():
                shape = list(local.shape)
                shape[dim] = sum(sizes_t)
                _check_same_on_all_ranks(sizes_t, group, rank, tuple(shape))
        shape = list(local.shape)
        shape[dim] = sum(sizes_t)
        spec = ShardSpec(mesh, mdim, dim, sizes_t, torch.Size(shape), id(mesh))
        return wrap_shard(local, spec)

    # -- metadata ---------------------------------------------------------------------------
    @property
    def spec(self) -> ShardSpec:
        return _spec_of(self)

    @property
    def sharding_sizes(self) -> tuple[int, ...]:
        """Every rank's local length along the sharded dimension (the sharding-shape metadata)."""
        return _spec_of(self).sizes

    @property
    def offsets(self) -> tuple[int, ...]:
        """``(0, s0, s0+s1, ..., N_global)``: rank r holds global rows ``offsets[r]:offsets[r+1]``."""
        return _spec_of(self).offsets

    @property
    def shard_dim(self) -> int:
        return _spec_of(self).dim

    @property
    def global_shape(self) -> torch.Size:
        return _spec_of(self).global_shape

    @property
    def mesh(self) -> DeviceMesh:
        return self._spec.mesh

    # -- conversions ------------------------------------------------------------------------
    def to_local(self) -> torch.Tensor:
        """This rank's shard as a plain tensor (a differentiable alias, no copy)."""
        return plain_alias(self)

    def full_tensor(self) -> ReplicatedTensor:
        """The whole tensor on every rank (differentiable).

        **Communication:** one ``all_to_all_single`` (this rank sends its shard to every rank:
        ``P * N_local * row_bytes``); backward: one ``all_to_all_single`` (reduce-scatter).
        """
        spec = _spec_of(self)
        full = comm.gather_uneven(self.to_local(), spec.sizes, spec.dim, spec.group)
        return ReplicatedTensor._make(full, spec.group, spec.num_ranks)

    def reshard(self, new_sizes: Sequence[int] | torch.Tensor) -> ShardTensor:
        """Move rows so that rank r holds ``new_sizes[r]`` of them, global order kept.

        **Communication:** one ``all_to_all_single``; each rank sends only the rows that change
        owner (its own block is copied locally by the collective).
        """
        spec = _spec_of(self)
        new_sizes = as_sizes(new_sizes, "new_sizes", check_sign=False)
        if len(new_sizes) != spec.num_ranks or any(s < 0 for s in new_sizes):
            raise ValueError(f"new_sizes must be {spec.num_ranks} non-negative ints (got {new_sizes})")
        if sum(new_sizes) != spec.num_global:
            raise ValueError(f"new_sizes must sum to N_global = {spec.num_global} (got {sum(new_sizes)})")
        old_off, new_off = spec.offsets, offsets_of(new_sizes)
        r = spec.rank

        def overlap(a0: int, a1: int, b0: int, b1: int) -> int:
            return max(0, min(a1, b1) - max(a0, b0))

        send = [overlap(old_off[r], old_off[r + 1], new_off[s], new_off[s + 1]) for s in range(spec.num_ranks)]
        recv = [overlap(old_off[s], old_off[s + 1], new_off[r], new_off[r + 1]) for s in range(spec.num_ranks)]
        moved = self.to_local().movedim(spec.dim, 0)
        out = comm.all_to_all(moved, send, recv, spec.group).movedim(0, spec.dim)
        shape = list(out.shape)
        shape[spec.dim] = spec.num_global
        new_spec = ShardSpec(spec.mesh, spec.mesh_dim, spec.dim, new_sizes, torch.Size(shape), spec.mesh_id,
                             _axis=spec._axis)
        return wrap_shard(out, new_spec)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # noqa: D105
        with torch._C.DisableTorchFunctionSubclass():
            body = torch.Tensor.__repr__(self.as_subclass(torch.Tensor))
        s = self._spec
        return f"ShardTensor(dim={s.dim}, sizes={s.sizes}, global_shape={tuple(s.global_shape)}, local={body})"

    def __reduce_ex__(self, proto):
        raise TypeError("a ShardTensor cannot be pickled: save x.to_local() and its sharding_sizes instead")

    def validate(self) -> ShardTensor:
        """Check the spec against the data and across ranks; return ``self``.

        Checks that the local length along the sharded dimension is ``sharding_sizes[rank]`` and
        that every rank of the mesh axis holds the same sharding sizes and global shape. Runs
        automatically in :meth:`from_local` under ``MESHSHARD_VALIDATE=1`` (or ``validate=True``).

        Raises
        ------
        ShardingError
            Naming the rank(s) that disagree and what each holds.

        **Communication:** one ``all_gather`` of ``P + ndim`` int64 per rank.
        """
        spec = self._spec
        with torch._C.DisableTorchFunctionSubclass():
            n_local = self.shape[spec.dim]
        _check_same_on_all_ranks(spec.sizes, spec.group, spec.rank, tuple(spec.global_shape), n_local)
        return self

    @property
    def local_shape(self) -> torch.Size:
        """This rank's shard's shape (``x.shape`` is the global shape)."""
        with torch._C.DisableTorchFunctionSubclass():
            return self.shape

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if inspected_by_compiler():  # dynamo/AOTAutograd fakeifying an input: the local tensor's metadata
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        if tracing():  # graph inputs' specs are read through their guard keys
            args, kwargs = _static_inputs(args, kwargs)
            if (impl := traced_dunder(func)) is not None:  # x ** 2, 1 - x, 2 / x: their ops (see traced_dunder)
                return impl(redispatch, *args, **(kwargs or {}))
        meta = _GLOBAL_META.get(func)
        if meta is not None:  # shape queries: answered from the spec, identical on every rank
            return meta(*args, **(kwargs or {}))
        if tracing():
            return _traced_result(func, args, _dispatch_any(func, args, kwargs))
        token = faults.enter_op(func)  # a failing collective's message names the op
        try:
            return _dispatch_any(func, args, kwargs)
        except Exception as exc:  # name this rank as the culprit for peers blocked in a collective
            faults.report_failure(exc, op_name(func))
            raise
        finally:
            faults.exit_op(token)


def redispatch(func: Callable, *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` through the sharded types' ``__torch_function__``, also inside one while traced.

    Eager, calling ``func`` is enough: an op inside a rule dispatches again on its ShardTensor arguments. Traced
    by dynamo (torch 2.13), an op called inside an inlined ``__torch_function__`` does **not** dispatch to the
    subclass (dynamo turns subclass dispatch off for the call), so it would run on the local shard alone. This
    calls the right ``__torch_function__`` explicitly.
    """
    if tracing():
        flat = [*args, *kwargs.values()]
        flat += [b for a in flat if isinstance(a, (list, tuple)) for b in a]
        for cls in (ShardTensor, ReplicatedTensor):
            if any(isinstance(a, cls) for a in flat):
                return cls.__torch_function__(func, (cls,), args, kwargs)
    return func(*args, **kwargs)


def _traced_result(func: Callable, args: tuple, out: Any) -> Any:
    """Traced code: refuse a rule's result that holds a plain tensor computed from a ShardTensor argument.

    Such a rule is written as other torch ops on its ShardTensor arguments (``std_mean`` as ``std`` and
    ``mean``...). Eager, those ops dispatch to their rules; traced (torch 2.13), dynamo does not dispatch
    them to the subclass inside ``__torch_function__`` (see :func:`redispatch`), so they ran on the local
    shard alone: a silent wrong answer. The check decides from the traced types, the same on every rank.
    """
    if not args or not isinstance(args[0], ShardTensor):
        return out
    items = out if isinstance(out, (list, tuple)) else (out,)
    if any(type(t) is torch.Tensor for t in items):
        raise UnsupportedOpError(
            f"{op_name(func)} on a ShardTensor cannot be compiled yet: its rule is written as other torch ops, "
            "which torch.compile does not dispatch to ShardTensor inside __torch_function__ (they would run on "
            "the local shard alone). Call it outside the compiled region (torch.compiler.disable), or write it "
            "as the ops it stands for."
        )
    return out


def _dispatch_any(func: Callable, args: tuple, kwargs: dict | None) -> Any:
    """A ShardTensor op: through autograd's entry (backward, grad), or the sharding rules."""
    if func in _AUTOGRAD_ENTRY:
        return autograd_entry(func, args, kwargs or {})
    if _has_dtensor(args, kwargs):
        args, kwargs = _dtensors_to_local(func, args, kwargs or {})
    return dispatch(func, args, kwargs or {})


def _spec_of(x: ShardTensor) -> ShardSpec:
    """``x``'s spec; in traced code, a graph input's spec is rebuilt from its guard key (constants)."""
    spec = x._spec
    if tracing() and spec._key is not None:
        return spec.static_copy()
    return spec


def _static_input(a):
    if isinstance(a, ShardTensor):
        if a._spec._key is not None:
            return wrap_shard(plain_alias(a), a._spec.static_copy())
        return a
    if isinstance(a, (list, tuple)) and not hasattr(a, "n_fields"):
        for b in a:
            if isinstance(b, ShardTensor) and b._spec._key is not None:
                return type(a)([_static_input(c) for c in a])
    return a


def _static_inputs(args: tuple, kwargs: dict | None):
    """Traced code: every ShardTensor graph input among the arguments (also in a list, e.g. ``torch.cat``),
    as a view whose spec is rebuilt from the constants of its guard key (so it holds no symbolic int)."""
    args = tuple([_static_input(a) for a in args])
    if kwargs:
        kwargs = {k: _static_input(v) for k, v in kwargs.items()}
    return args, kwargs


def plain_alias(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a plain tensor sharing its storage and autograd history.

    Eager: ``as_subclass(Tensor)``. Traced by dynamo (which cannot trace ``as_subclass`` to a
    plain tensor): ``view_as``, the same alias as a graph op.
    """
    with torch._C.DisableTorchFunctionSubclass():
        if tracing():
            return t.view_as(t)
        return t.as_subclass(torch.Tensor)


def _size(x: ShardTensor, dim: int | None = None):
    shape = x._spec.global_shape
    if dim is None:
        return shape
    if not -len(shape) <= dim < len(shape):
        raise IndexError(f"Dimension out of range (expected to be in range of [{-len(shape)}, {len(shape) - 1}], "
                         f"but got {dim})")
    return shape[dim]


def _len(x: ShardTensor) -> int:
    shape = x._spec.global_shape
    if not shape:
        raise TypeError("len() of a 0-d tensor")
    return shape[0]


_T = torch.Tensor
_GLOBAL_META: dict = {
    _T.shape.__get__: lambda x: x._spec.global_shape,
    _T.size: _size,
    _T.dim: lambda x: len(x._spec.global_shape),
    _T.ndimension: lambda x: len(x._spec.global_shape),
    _T.ndim.__get__: lambda x: len(x._spec.global_shape),
    _T.numel: lambda x: x._spec.global_shape.numel(),
    _T.nelement: lambda x: x._spec.global_shape.numel(),
    torch.numel: lambda x: x._spec.global_shape.numel(),
    _T.__len__: _len,
}
_AUTOGRAD_ENTRY = frozenset((_T.backward, torch.autograd.backward, torch.autograd.grad))


def _has_dtensor(args, kwargs) -> bool:
    dtensor = if_imported("torch.distributed.tensor", "DTensor")
    if dtensor is None:  # not imported by anyone: no DTensor exists
        return False
    for a in args:
        if isinstance(a, dtensor):
            return True
    return bool(kwargs) and any(isinstance(a, dtensor) for a in kwargs.values())


def _dtensors_to_local(func, args, kwargs):
    """Replicated DTensor weights take part through their local value (differentiably)."""
    dtensor = if_imported("torch.distributed.tensor", "DTensor")

    def conv(a):
        if not isinstance(a, dtensor):
            return a
        if not all(p.is_replicate() for p in a.placements):
            raise UnsupportedOpError(
                f"{op_name(func)}: a DTensor operand with placements {a.placements} cannot be mixed with a "
                "ShardTensor; only replicated DTensors (e.g. weights) can"
            )
        return a.to_local()

    return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}


def wrap_shard(local: torch.Tensor, spec: ShardSpec) -> ShardTensor:
    """``local`` (a plain tensor) as a ShardTensor with ``spec``: no copy, autograd kept."""
    out = local.as_subclass(ShardTensor)
    out._spec = spec
    return out


def _check_same_on_all_ranks(
    sizes: tuple[int, ...],
    group,
    rank: int,
    global_shape: tuple[int, ...] = (),
    n_local: int | None = None,
) -> None:
    """Raise :class:`ShardingError` on **every** rank unless all ranks hold the same sizes (and
    shape), and (given ``n_local``) every rank's local length is its entry of the sizes.

    One ``all_gather`` (:func:`meshshard.comm.agree` with the sizes as payload); every rank sees every
    rank's view, so all raise together (none is left waiting in a later collective).
    """
    world = len(sizes)
    if dist.get_world_size(group) != world:
        raise ShardingError(
            f"[rank {rank}] the spec has {world} sharding sizes but the process group has "
            f"{dist.get_world_size(group)} ranks"
        )
    local = sizes[rank] if n_local is None else n_local
    everyone = comm.agree(None, group, payload=[*sizes, *global_shape, local]).payloads
    views = everyone[:, :-1]
    differ = [r for r in range(world) if not torch.equal(views[r], views[rank])]
    if differ:
        what = "sharding sizes" if any(not torch.equal(views[r, :world], views[rank, :world]) for r in differ) else (
            "global shapes"
        )
        detail = "; ".join(
            f"rank {r} has {tuple(views[r, :world].tolist())}"
            + (f" shape {tuple(views[r, world:].tolist())}" if global_shape else "")
            for r in range(world)
        )
        raise ShardingError(f"[rank {rank}] {what} disagree between ranks {[rank, *differ]}: {detail}")
    wrong = [r for r in range(world) if int(everyone[r, -1]) != sizes[r]]
    if wrong:
        detail = "; ".join(f"rank {r} holds {int(everyone[r, -1])} (sharding_sizes[{r}] = {sizes[r]})" for r in wrong)
        raise ShardingError(
            f"[rank {rank}] local shard lengths do not match the spec on ranks {wrong}: {detail}"
        )


class ReplicatedTensor(torch.Tensor):
    """A plain tensor that holds the same value on every rank of a domain group.

    Reductions over a sharded dimension return one. It behaves exactly like a ``torch.Tensor``
    except in autograd: its gradient is partial on each rank (see :mod:`meshshard.comm`), so every
    way of starting a backward pass from it (``backward()``, ``backward(g)``,
    ``torch.autograd.backward``, ``torch.autograd.grad``) seeds ``g / P`` on each of the ``P`` ranks,
    and ``torch.autograd.grad`` sums the gradients of non-sharded inputs over the group.
    """

    _group: Any = None
    _group_size: int = 1

    @staticmethod
    def _make(t: torch.Tensor, group: Any, group_size: int) -> ReplicatedTensor:
        with torch._C.DisableTorchFunctionSubclass():
            out = t.as_subclass(ReplicatedTensor)
        out._group, out._group_size = group, group_size
        return out

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if inspected_by_compiler():
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        if func in _AUTOGRAD_ENTRY:  # backward/grad: the collectives of the backward pass run inside
            token = faults.enter_op(func)
            try:
                return autograd_entry(func, args, kwargs or {})
            finally:
                faults.exit_op(token)
        if not all(issubclass(cls, t) for t in types):
            return NotImplemented
        if tracing() and (impl := traced_dunder(func)) is not None:  # 2 / loss traced: its ops (see traced_dunder)
            return impl(redispatch, *args, **(kwargs or {}))
        with torch._C.DisableTorchFunctionSubclass():
            ret = func(*args, **(kwargs or {}))
        if func is torch.Tensor.as_subclass:
            return ret
        src = _first_replicated(args, kwargs)
        return _as_replicated(ret, src._group, src._group_size) if src is not None else ret

    def to_plain(self) -> torch.Tensor:
        """A plain-tensor alias (its ``backward()`` seeds 1, not ``1 / P``)."""
        return plain_alias(self)


def _first_replicated(args, kwargs) -> ReplicatedTensor | None:
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, ReplicatedTensor):
            return a
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, ReplicatedTensor):
                    return b
    return None


def _as_replicated(ret, group, size: int):
    if type(ret) is torch.Tensor:
        return ReplicatedTensor._make(ret, group, size)
    if hasattr(ret, "n_fields"):  # torch.return_types structseqs, e.g. (values, indices)
        return type(ret)(tuple(_as_replicated(r, group, size) for r in ret))
    if isinstance(ret, (list, tuple)):
        return type(ret)(_as_replicated(r, group, size) for r in ret)
    return ret


# -- every way into autograd ----------------------------------------------------------------------
def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    return list(value)


def _seed(out: torch.Tensor, grad: torch.Tensor | None, name: str) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
    """(plain output, its seed, its group) for one output of a backward pass."""
    if isinstance(out, ReplicatedTensor):
        plain = out.to_plain()
        if grad is None:
            if plain.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            grad = torch.ones_like(plain)
        elif isinstance(grad, ShardTensor):
            raise TypeError(f"{name}: the gradient of a replicated output must be a plain tensor (got a ShardTensor)")
        elif isinstance(grad, ReplicatedTensor):
            grad = grad.to_plain()
        return plain, grad / out._group_size, out._group if out._group_size > 1 else None
    if isinstance(out, ShardTensor):
        spec = out._spec
        if grad is None:
            if spec.global_shape.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            grad = torch.ones_like(out.to_local())
        elif isinstance(grad, ShardTensor):
            if not spec.same_sharding(grad._spec) or grad._spec.global_shape != spec.global_shape:
                raise ShardingError(
                    f"[rank {spec.rank}] {name}: the gradient is sharded as {grad._spec.sizes} with global shape "
                    f"{tuple(grad._spec.global_shape)}, the output as {spec.sizes} with {tuple(spec.global_shape)}"
                )
            grad = grad.to_local()
        elif isinstance(grad, torch.Tensor):
            if tuple(grad.shape) != tuple(spec.global_shape):
                raise ShardingError(
                    f"[rank {spec.rank}] {name}: a plain gradient for a ShardTensor output must have its global shape "
                    f"{tuple(spec.global_shape)} (got {tuple(grad.shape)}); or pass a ShardTensor sharded like it"
                )
            grad = grad.narrow(spec.dim, spec.offsets[spec.rank], spec.sizes[spec.rank])
        return out.to_local(), grad, spec.group if spec.num_ranks > 1 else None
    return out, grad, None


def _plain_inputs(inputs):
    """The inputs as autograd sees them: a ShardTensor's own gradient edge (``to_local()`` would be a new alias,
    off the recorded graph), plain tensors as they are."""
    return [_gradient_edge(t) if isinstance(t, (ShardTensor, ReplicatedTensor)) else t for t in inputs]


def _gradient_edge(t: torch.Tensor):
    # Without the subclass: for a leaf, get_gradient_edge finds the AccumulateGrad node through
    # ``t.view_as(t)``, which through the sharding rules would be a node of a fresh alias, off the graph.
    with torch._C.DisableTorchFunctionSubclass():
        return torch.autograd.graph.get_gradient_edge(t)


def autograd_entry(func, args: tuple, kwargs: dict):
    """``Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad`` with sharded operands.

    Seeds replicated outputs with ``g / P`` and, for ``grad``, returns ShardTensor gradients for
    ShardTensor inputs and the group-summed (single-process) gradient for every other input.

    **Communication:** ``grad`` adds, when some input is not sharded, one small ``all_gather`` (which
    inputs got a gradient on some rank: :func:`meshshard.comm.agree`) and one ``all_reduce`` per such input
    (of its size); the backward passes communicate as their ops' rules document.
    """
    name = op_name(func)
    if func is torch.Tensor.backward:
        a = bind(func, args, kwargs, ("self", "gradient", "retain_graph", "create_graph", "inputs"),
                 {"create_graph": False})
        outputs, grads = [a["self"]], [a["gradient"]]
    elif func is torch.autograd.backward:
        a = bind(func, args, kwargs, ("tensors", "grad_tensors", "retain_graph", "create_graph", "grad_variables",
                                      "inputs"), {"create_graph": False})
        outputs = _as_list(a["tensors"])
        grads = _as_list(a["grad_tensors"] if a["grad_tensors"] is not None else a["grad_variables"])
    else:
        a = bind(func, args, kwargs, ("outputs", "inputs", "grad_outputs", "retain_graph", "create_graph",
                                      "only_inputs", "allow_unused", "is_grads_batched", "materialize_grads"),
                 {"create_graph": False, "only_inputs": True, "is_grads_batched": False, "materialize_grads": False})
        if a["is_grads_batched"]:
            raise UnsupportedOpError("torch.autograd.grad(is_grads_batched=True) is not supported with ShardTensors")
        outputs = _as_list(a["outputs"])
        grads = _as_list(a["grad_outputs"])
    if grads and len(grads) != len(outputs):
        raise RuntimeError(f"{name}: got {len(grads)} gradients for {len(outputs)} outputs")
    grads = grads or [None] * len(outputs)
    seeded = [_seed(o, g, name) for o, g in zip(outputs, grads)]
    plain_out = [s[0] for s in seeded]
    plain_grads = [s[1] for s in seeded]
    group = next((s[2] for s in seeded if s[2] is not None), None)
    if func is not torch.autograd.grad:
        inputs = a["inputs"]
        inputs = None if inputs is None else _plain_inputs(_as_list(inputs))
        torch.autograd.backward(plain_out, plain_grads, a["retain_graph"], a["create_graph"], inputs=inputs)
        return None
    inputs = _as_list(a["inputs"])
    result = torch.autograd.grad(
        plain_out, _plain_inputs(inputs), plain_grads, a["retain_graph"], a["create_graph"],
        allow_unused=a["allow_unused"], materialize_grads=a["materialize_grads"],
    )
    if group is not None and any(not isinstance(t, ShardTensor) for t in inputs):
        # A plain input's gradient may be None on a rank whose shard never reached it (an empty rank) and not
        # on the others: agree, so that every rank sums (zeros where unreached) or none does.
        reached = comm.agree(None, group, payload=[int(g is not None) for g in result]).payloads.any(0).tolist()
        result = [torch.zeros_like(t) if g is None and hit and not isinstance(t, ShardTensor) else g
                  for t, g, hit in zip(inputs, result, reached)]
    out = []
    for t, g in zip(inputs, result):
        if g is None:
            out.append(None)
        elif isinstance(t, ShardTensor):
            out.append(wrap_shard(g, t._spec))
        elif group is not None:  # partial on each rank: the true gradient is the sum over the group
            out.append(comm.all_reduce(g, group))
        else:
            out.append(g)
    return tuple(out)


def scatter(
    global_tensor: torch.Tensor,
    partition: Partition | Sequence[int] | torch.Tensor,
    mesh: DeviceMesh,
    dim: int = 0,
    *,
    mesh_dim: int | str | None = None,
) -> ShardTensor:
    """Keep this rank's shard of a tensor every rank can see (e.g. loaded from the same file).

    ``partition`` is a :class:`meshshard.partition.Partition` (rank r keeps
    ``global_tensor[perm[offsets[r]:offsets[r+1]]]``, i.e. partition order) or a sequence of
    sizes (rank r keeps the contiguous rows ``offsets[r]:offsets[r+1]``).

    **Communication:** none: every rank indexes its own rows.
    """
    if not isinstance(global_tensor, torch.Tensor):
        raise TypeError(f"Expected 'global_tensor' to be a torch.Tensor (got {type(global_tensor).__name__})")
    if isinstance(global_tensor, ShardTensor):
        raise TypeError("scatter expects a plain (global) tensor, got a ShardTensor")
    if global_tensor.dim() == 0:
        raise ValueError("global_tensor must have at least one dimension to shard (got a 0-d tensor)")
    if not -global_tensor.dim() <= dim < global_tensor.dim():
        raise ValueError(f"dim must be in [-{global_tensor.dim()}, {global_tensor.dim()}) (got {dim})")
    dim %= global_tensor.dim()
    mdim = norm_mesh_dim(mesh, mesh_dim)
    rank = axis_group_rank(mesh, mdim)[1]
    n = global_tensor.shape[dim]
    perm = partition.perm if isinstance(partition, Partition) else None
    sizes = as_sizes(partition.sizes if perm is not None else partition, "partition")
    if len(sizes) != mesh.size(mdim):
        raise ValueError(
            f"the partition has {len(sizes)} parts but mesh axis {mdim} has {mesh.size(mdim)} ranks"
        )
    if sum(sizes) != n:
        raise ValueError(f"the partition covers {sum(sizes)} points but global_tensor has {n} along dim {dim}")
    start = offsets_of(sizes)[rank]
    if perm is not None and (not isinstance(perm, torch.Tensor) or perm.numel() != n):
        raise ValueError(f"partition.perm must be a tensor of {n} indices (got {getattr(perm, 'shape', perm)})")
    if perm is None:
        local = global_tensor.narrow(dim, start, sizes[rank])
    else:
        idx = perm[start : start + sizes[rank]].to(global_tensor.device)
        local = global_tensor.index_select(dim, idx)
    return ShardTensor.from_local(local, mesh, sizes=sizes, dim=dim, mesh_dim=mdim, validate=False)


register_method_binding()
