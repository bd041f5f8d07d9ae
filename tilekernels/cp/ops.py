"""THD context-parallel ops: the index maps and the fused cp <-> hp all_to_all.

``thd_cp_to_hp`` / ``thd_hp_to_cp`` are collectives, so unlike the other
families they are NOT ``torch.library.custom_op``s (a custom op must not run a
collective behind the compiler's back): each is an ``autograd.Function`` whose
backward is the other direction. The registry contract is unchanged: the spec
entry is called as ``entry(*inputs, backend=..., **params)`` and the chosen
backend's kernels come from ``_glue.get_kernel`` (called as ``kernel(x, plan,
group, out)``); the torch backend's kernels are registered below with
``@kernel``, the cutile backend's in :mod:`tilekernels.cp.cutile_pack`.

The fused path does exactly ONE ``torch.distributed.all_to_all_single`` per
direction, with the feature-section split and the zigzag token reordering
folded into one copy before it and one copy after it. torch backend: two
gathers through index maps (:mod:`tilekernels.cp.perm`, cached per
(cu_seqlens values, cp, sections, device); cu_seqlens is read on the host once
per call). cutile backend: pack/unpack kernels that compute every row's source
from cu_seqlens on the device (a GPU cu_seqlens is never read on the host).
Pure copies: the result is bitwise what the per-sequence, per-section
reference (:mod:`tilekernels.cp.reference`) gives, on either backend.
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from tilekernels._glue import empty, get_kernel, kernel
from tilekernels._opgen import _no_second_order

from . import perm as _perm
from .perm import A2APerm

# ---------------------------------------------------------------- thd_cp_a2a_perm


@kernel("thd_cp_a2a_perm", "torch", "fwd")
def _a2a_perm_torch(cu_seqlens, cp, split_sections, token_perm, token_inv, feature_perm, feature_inv):
    # tensor ops on cu_seqlens' device; T is the outputs' length (no host read of cu_seqlens)
    tp, ti = _perm.token_perm(cu_seqlens, cp, total=token_perm.shape[0])
    token_perm.copy_(tp)
    token_inv.copy_(ti)
    if split_sections is not None:
        fp, fi = _perm.feature_perm(split_sections, cp, feature_perm.device)
        feature_perm.copy_(fp)
        feature_inv.copy_(fi)


def thd_cp_a2a_perm(cu_seqlens: Tensor, *, cp: int, split_sections: Optional[Sequence[int]] = None,
                    total_tokens: Optional[int] = None, backend: str = "torch") -> A2APerm:
    """Index maps between rank-major zigzag and natural packed token order, and
    between section-major and rank-major feature order (not differentiable).

    cu_seqlens [N+1] int32/int64 (starts at 0, nondecreasing, lengths % 2*cp == 0)
    -> A2APerm(token_perm [T], token_inv [T], feature_perm [D], feature_inv [D]),
    int64 on cu_seqlens' device, T = cu_seqlens[-1], D = sum(split_sections)
    (feature maps None without split_sections). ``token_perm[j]`` is the natural
    index of the j-th rank-major token (rank 0's local tokens, then rank 1's, ...);
    ``feature_perm[k]`` the section-major column of the k-th rank-major column.
    See :mod:`tilekernels.cp.perm` for the full conventions.

    Host reads: the maps are built with tensor ops on cu_seqlens' device; only their
    length T = cu_seqlens[-1] is a host fact. ``total_tokens`` (optional) is that T
    given by the caller (through the registry it is checked against cu_seqlens on the
    device, asynchronously): then a GPU cu_seqlens is never read on the host and the
    call is sync-free (graph-capturable). Without it T is read from cu_seqlens: for a
    GPU cu_seqlens that is one device sync per call, by design.
    """
    op = "thd_cp_a2a_perm"
    _no_transforms(op, "its maps are written by a kernel that takes plain tensors")
    _eager_only(op)
    sections = _sections(op, split_sections)
    dev = cu_seqlens.device
    total = int(cu_seqlens[-1]) if total_tokens is None else operator.index(total_tokens)
    tp, ti = empty((total,), torch.int64, dev), empty((total,), torch.int64, dev)
    fp = fi = None
    if sections is not None:
        fp, fi = empty((sum(sections),), torch.int64, dev), empty((sum(sections),), torch.int64, dev)
    get_kernel(op, backend, "fwd")(cu_seqlens, cp, sections, tp, ti, fp, fi)
    return A2APerm(tp, ti, fp, fi)


# ---------------------------------------------------------------- the fused all_to_all


def _to_hp_torch(x: Tensor, plan: "_Plan", group: Any, out: Tensor) -> None:
    """x [Tl, D] (cp side) -> out [cp*Tl, D/cp] (hp side). One gather, one
    all_to_all_single, one gather."""
    cp = plan.cp
    t_local, d = x.shape
    dc = d // cp
    rows = torch.arange(t_local, device=x.device)
    # send[q, t, :] = x[t, columns rank q owns] (section split and rank split in one gather)
    send = x[rows[None, :, None], plan.feature_perm.view(cp, 1, dc)]
    recv = torch.empty_like(send)  # fully written by the collective
    dist.all_to_all_single(recv, send, group=group)
    # recv is every rank's tokens in rank-major order: put them in natural order
    torch.index_select(recv.view(cp * t_local, dc), 0, plan.token_inv, out=out)


def _to_cp_torch(x: Tensor, plan: "_Plan", group: Any, out: Tensor) -> None:
    """x [T, D/cp] (hp side) -> out [T/cp, D] (cp side). One gather, one
    all_to_all_single, one gather."""
    cp = plan.cp
    total, dc = x.shape
    t_local = total // cp
    send = x.index_select(0, plan.token_perm)  # rank-major: block q = rank q's zigzag tokens
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    # recv[q, t, :] = my token t, rank q's columns; out[t, c] = recv[rank, t, col] of column c
    rows = torch.arange(t_local, device=x.device)
    fi = plan.feature_inv
    torch.ops.aten.index.Tensor_out(
        recv.view(cp, t_local, dc), [(fi // dc)[None, :], rows[:, None], (fi % dc)[None, :]], out=out)


# each direction's backward is the other direction's forward; every a2a kernel (torch and
# cutile) is called as kernel(x, plan, group, out)
kernel("thd_cp_to_hp", "torch", "fwd")(_to_hp_torch)
kernel("thd_cp_to_hp", "torch", "bwd")(_to_cp_torch)
kernel("thd_hp_to_cp", "torch", "fwd")(_to_cp_torch)
kernel("thd_hp_to_cp", "torch", "bwd")(_to_hp_torch)


@dataclass(frozen=True)
class _Plan:
    """What both directions need. cp and the full (cp-side) section widths; the torch
    backend's four index maps (None for cutile); the cutile backend's cu_seqlens, int32
    on x's device (None for torch: its kernels compute every row's source from it)."""
    cp: int
    sections: tuple[int, ...]
    token_perm: Optional[Tensor] = None
    token_inv: Optional[Tensor] = None
    feature_perm: Optional[Tensor] = None
    feature_inv: Optional[Tensor] = None
    cu: Optional[Tensor] = None


@functools.lru_cache(maxsize=16)
def _plan(cu: tuple[int, ...], cp: int, sections: tuple[int, ...], device: torch.device) -> _Plan:
    """torch backend: the index maps, cached per (cu_seqlens values, cp, sections, device)."""
    tp, ti = _perm.token_perm(torch.tensor(cu, dtype=torch.int64, device="cpu"), cp)
    fp, fi = _perm.feature_perm(sections, cp)
    return _Plan(cp, sections, tp.to(device), ti.to(device), fp.to(device), fi.to(device))


@functools.lru_cache(maxsize=16)
def _host_cu_on(cu: tuple[int, ...], device: torch.device) -> Tensor:
    """A CPU cu_seqlens' int32 copy on ``device``, cached per (values, device)."""
    return torch.tensor(cu, dtype=torch.int32, device="cpu").to(device)


def _device_plan(cu_seqlens: Tensor, cp: int, sections: tuple[int, ...], device: torch.device) -> _Plan:
    """cutile backend: no index maps, only cu_seqlens as int32 on x's device. A CPU
    cu_seqlens is read on the host (no sync) and its device copy cached per value; a GPU
    one is never read on the host: it is used as it is (int32 on x's device: nothing to
    build, nothing to cache) or converted on the device (int64, or another GPU), async."""
    if cu_seqlens.device.type == "cpu":
        cu = _host_cu_on(tuple(int(v) for v in cu_seqlens.tolist()), device)
    else:
        cu = cu_seqlens.to(device=device, dtype=torch.int32)
    return _Plan(cp, sections, cu=cu)


def _run(op: str, pass_: str, x: Tensor, plan: _Plan, group: Any, backend: str) -> Tensor:
    """Run ``op``'s ``pass_`` kernel: to_hp fwd / hp_to_cp bwd go cp -> hp."""
    to_hp = (op == "thd_cp_to_hp") == (pass_ == "fwd")
    cp = plan.cp
    if to_hp:
        out = empty((x.shape[0] * cp, x.shape[1] // cp), x.dtype, x.device)
    else:
        out = empty((x.shape[0] // cp, x.shape[1] * cp), x.dtype, x.device)
    get_kernel(op, backend, pass_)(x, plan, group, out)
    return out


class _CpA2A(torch.autograd.Function):
    """autograd.Function (not a custom op: it runs a collective) for both
    directions; the backward of one is the forward of the other."""

    @staticmethod
    def forward(ctx, x, plan, group, op, backend):
        ctx.plan, ctx.group, ctx.op, ctx.backend = plan, group, op, backend
        return _run(op, "fwd", x, plan, group, backend)

    @staticmethod
    def backward(ctx, dout):
        """The other direction's collective; a gradient through it (second order: create_graph) raises naming the
        op, as for the generated ops (the collective writes a tensor autograd does not track, so such a gradient
        was silently dropped)."""
        with torch.no_grad():
            dx = _run(ctx.op, "bwd", dout.contiguous(), ctx.plan, ctx.group, ctx.backend)
        return (*_no_second_order(ctx.op, (dx,), (dout,)), None, None, None, None)


def _eager_only(op: str) -> None:
    """The CP ops are not traced by torch.compile (host reads of cu_seqlens' values, and for the collectives a c10d
    all_to_all in an autograd.Function): refused by name instead of dynamo's data-dependent guard error."""
    if torch.compiler.is_compiling():
        raise NotImplementedError(f"{op}: torch.compile cannot trace the CP ops (they read cu_seqlens' values on "
                                  "the host; the collectives run a c10d all_to_all): call it outside the compiled "
                                  "region (a graph break, e.g. a torch.compiler.disable'd function; not fullgraph)")


def _no_transforms(op: str, why: str) -> None:
    """The CP ops take no torch.func transform (registry/transforms.py says what the other ops take)."""
    if torch._C._are_functorch_transforms_active():
        raise NotImplementedError(f"{op}: torch.func transforms (grad, vjp, functionalize) are not supported: {why}")


def _sections(op: str, split_sections) -> Optional[tuple[int, ...]]:
    if split_sections is None:
        return None
    try:
        out = tuple(operator.index(w) for w in split_sections)
    except TypeError:
        from registry import SpecError

        raise SpecError(op, "param split_sections", "a sequence of ints (section widths)",
                        repr(split_sections)) from None
    return out


def group_size(group) -> Optional[int]:
    """The cp process group's size, None while torch.distributed is not initialized
    (the spec's resolver of ``cp=None``: the registry then leaves the cp rules to the
    backend requirement that refuses the call)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_world_size(group)


def resolve_cp(params: dict) -> Optional[int]:
    """Resolver of the specs' ``cp`` param: None -> the group's size (see group_size)."""
    return group_size(params.get("group"))


def _check_group(op: str, group, cp) -> int:
    """cp, checked against the group's size (the registry resolved ``cp=None`` to it
    and checked every cp rule; a direct call of the entry is checked here)."""
    from registry import SpecError

    world = group_size(group)
    if world is None:
        raise SpecError(op, "param group", "an initialized torch.distributed process group "
                        "(None = the default group)", "torch.distributed is not initialized")
    if cp is not None and cp != world:
        raise SpecError(op, "param cp", f"the process group's size {world}", cp)
    return world


def _a2a(op: str, x: Tensor, cu_seqlens: Tensor, split_sections, group, cp, backend: str) -> Tensor:
    _eager_only(op)
    _no_transforms(op, "the op runs a collective, and its autograd.Function has no setup_context form")
    sections = _sections(op, split_sections)
    cp = _check_group(op, group, cp)
    full_width = x.shape[1] * (cp if op == "thd_hp_to_cp" else 1)
    sections = sections if sections is not None else (full_width,)
    if backend == "torch":
        # the torch backend's one host read of cu_seqlens per call (its maps are cached per
        # value); a GPU cu_seqlens costs one device sync here (pass it on the CPU to avoid it)
        cu = tuple(int(v) for v in cu_seqlens.tolist())
        plan = _plan(cu, cp, sections, x.device)
    else:  # cutile: the kernels compute every row's source from cu_seqlens on the device
        plan = _device_plan(cu_seqlens, cp, sections, x.device)
    return _CpA2A.apply(x, plan, group, op, backend)


def thd_cp_to_hp(x: Tensor, cu_seqlens: Tensor, *, split_sections: Optional[Sequence[int]] = None,
                 group: Any = None, cp: Optional[int] = None, backend: str = "torch") -> Tensor:
    """Context-parallel -> head-parallel all_to_all for packed (THD) sequences.

    x [T_global/cp, D] contiguous (bf16/fp16/fp32/fp64): this rank's zigzag
    tokens (chunks r and 2cp-1-r of every sequence, in sequence order), all
    features, sections q|k|v|... of widths ``split_sections`` (None = one
    section of width D; each a multiple of cp). cu_seqlens [N+1] int32/int64
    global offsets (any device). Returns [T_global, D/cp] in x.dtype: every
    token in natural packed order, this rank's r-th 1/cp of every section, in
    section order. ``group``: the cp process group (None = default group);
    ``cp`` (optional) must equal its size. Exactly one all_to_all_single;
    backward = ``thd_hp_to_cp`` of the gradient. An autograd.Function, not a
    custom op (it is a collective).
    """
    return _a2a("thd_cp_to_hp", x, cu_seqlens, split_sections, group, cp, backend)


def thd_hp_to_cp(x: Tensor, cu_seqlens: Tensor, *, split_sections: Optional[Sequence[int]] = None,
                 group: Any = None, cp: Optional[int] = None, backend: str = "torch") -> Tensor:
    """Head-parallel -> context-parallel all_to_all: the inverse of thd_cp_to_hp.

    x [T_global, D/cp] contiguous: natural packed order, this rank's 1/cp of
    every section (``split_sections`` are the full cp-side widths, as for
    thd_cp_to_hp; None = one section). Returns [T_global/cp, D] in x.dtype:
    this rank's zigzag tokens with all features, section-major. Exactly one
    all_to_all_single; backward = ``thd_cp_to_hp`` of the gradient. An
    autograd.Function, not a custom op (it is a collective).
    """
    return _a2a("thd_hp_to_cp", x, cu_seqlens, split_sections, group, cp, backend)
