"""Torch references for the THD context-parallel ops: the test oracle.

These are the straightforward formulations the fused path replaced:

* ``thd_cp_a2a_perm``: the index maps built by walking ranks, sequences and
  zigzag chunks in Python;
* ``thd_cp_to_hp`` / ``thd_hp_to_cp``: one ``all_to_all_single`` per
  (sequence, feature section), with the zigzag undone (or redone) chunk by
  chunk per sequence. Differentiable through autograd (each collective's
  backward is the all_to_all of its gradient), never a custom op.

Pure data movement: the output dtype is the input dtype and every value is
copied bit for bit (so float64 in gives float64 out, and the fused path must
agree bitwise).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from .perm import A2APerm


def _cu(cu_seqlens: Tensor) -> list[int]:
    return [int(v) for v in cu_seqlens.detach().cpu().tolist()]


def thd_cp_a2a_perm(cu_seqlens: Tensor, *, cp: int, split_sections: Optional[Sequence[int]] = None,
                    total_tokens: Optional[int] = None) -> A2APerm:
    """Loop formulation of the maps (conventions in :mod:`tilekernels.cp.perm`).

    cu_seqlens [N+1] int32/int64 -> A2APerm of int64 tensors on cu_seqlens' device.
    ``total_tokens`` (= cu_seqlens[-1], the fused op's sync-free hint) changes nothing here.
    """
    cu = _cu(cu_seqlens)
    rank_major: list[int] = []
    for r in range(cp if cu[-1] else 0):   # no tokens: no rank holds any (a huge cp must not loop)
        for i in range(len(cu) - 1):
            h = (cu[i + 1] - cu[i]) // (2 * cp)
            for chunk in (r, 2 * cp - 1 - r):
                start = cu[i] + chunk * h
                rank_major.extend(range(start, start + h))
    dev = cu_seqlens.device
    tp = torch.tensor(rank_major, dtype=torch.int64, device=dev)
    ti = torch.argsort(tp)  # position of natural token p in rank-major order
    if split_sections is None:
        return A2APerm(tp, ti, None, None)
    cols: list[int] = []
    for r in range(cp):
        start = 0
        for w in split_sections:
            part = w // cp
            cols.extend(range(start + r * part, start + (r + 1) * part))
            start += w
    fp = torch.tensor(cols, dtype=torch.int64, device=dev)
    return A2APerm(tp, ti, fp, torch.argsort(fp))


def zigzag_local(x: Tensor, cu_seqlens: Tensor, cp: int, rank: int) -> Tensor:
    """Rank ``rank``'s zigzag shard of a global packed tensor (a test/bench helper).

    x [T_global, ...] natural packed order -> [T_global/cp, ...]: for every
    sequence in order, its chunks rank and 2cp-1-rank (L_i/(2cp) tokens each).
    """
    if not 0 <= rank < cp:
        raise ValueError(f"zigzag_local: rank must be in [0, cp={cp}), got {rank}")
    cu = _cu(cu_seqlens)
    parts = []
    for i in range(len(cu) - 1):
        h = (cu[i + 1] - cu[i]) // (2 * cp)
        for chunk in (rank, 2 * cp - 1 - rank):
            parts.append(x[cu[i] + chunk * h: cu[i] + (chunk + 1) * h])
    return torch.cat(parts) if parts else x[:0].clone()


class _AllToAll(torch.autograd.Function):
    """One equal-split all_to_all_single over dim 0; its adjoint is itself."""

    @staticmethod
    def forward(ctx, send: Tensor, group: Any) -> Tensor:
        ctx.group = group
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send.contiguous(), group=group)
        return recv

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _AllToAll.apply(grad.contiguous(), ctx.group), None


def _world(group: Any, cp: Optional[int]) -> int:
    world = dist.get_world_size(group)
    if cp is not None and cp != world:
        raise ValueError(f"cp={cp} but the process group has {world} ranks")
    return world


def _sequences(cu_seqlens: Tensor, cp: int):
    """(start, end, half-chunk length L/(2cp)) of every non-empty sequence, globally."""
    cu = _cu(cu_seqlens)
    for i in range(len(cu) - 1):
        if cu[i + 1] > cu[i]:
            yield cu[i], cu[i + 1], (cu[i + 1] - cu[i]) // (2 * cp)


def thd_cp_to_hp(x: Tensor, cu_seqlens: Tensor, *, split_sections: Optional[Sequence[int]] = None,
                 group: Any = None, cp: Optional[int] = None) -> Tensor:
    """Per-sequence, per-section cp -> hp all_to_all.

    x [T_global/cp, D] (this rank's zigzag tokens, all features, section-major)
    -> [T_global, D/cp] (all tokens in natural packed order; this rank's 1/cp of
    every section, in section order). One collective per (sequence, section).
    """
    cp = _world(group, cp)
    sections = list(split_sections) if split_sections is not None else [x.shape[1]]
    rows = []
    for start_, end_, h in _sequences(cu_seqlens, cp):
        mine = x[start_ // cp: end_ // cp]              # [2h, D]: my chunks r and 2cp-1-r
        cols, start = [], 0
        for w in sections:
            piece = mine[:, start:start + w]
            start += w
            send = torch.stack(piece.chunk(cp, dim=1))  # [cp, 2h, w/cp]: block q goes to rank q
            recv = _AllToAll.apply(send, group)         # block q: rank q's 2h tokens, my columns
            chunks: list[Optional[Tensor]] = [None] * (2 * cp)
            for q in range(cp):
                chunks[q] = recv[q, :h]
                chunks[2 * cp - 1 - q] = recv[q, h:]
            cols.append(torch.cat(chunks))              # [n, w/cp], natural order
        rows.append(torch.cat(cols, dim=1))
    if not rows:  # no tokens: an empty result that still depends on x (the oracle's fwd+bwd differentiates it)
        return x[:0, : x.shape[1] // cp].clone()
    return torch.cat(rows)


def thd_hp_to_cp(x: Tensor, cu_seqlens: Tensor, *, split_sections: Optional[Sequence[int]] = None,
                 group: Any = None, cp: Optional[int] = None) -> Tensor:
    """Per-sequence, per-section hp -> cp all_to_all (the inverse of thd_cp_to_hp).

    x [T_global, D/cp] (natural order, this rank's 1/cp of every section) ->
    [T_global/cp, D] (this rank's zigzag tokens, all features, section-major).
    split_sections are the full (cp-side) widths, as in thd_cp_to_hp.
    """
    cp = _world(group, cp)
    sections = list(split_sections) if split_sections is not None else [x.shape[1] * cp]
    rows = []
    for start_, end_, h in _sequences(cu_seqlens, cp):
        seq = x[start_: end_]                           # [n, D/cp]
        cols, start = [], 0
        for w in sections:
            piece = seq[:, start:start + w // cp]
            start += w // cp
            nat = piece.split(h)                        # the 2cp natural chunks
            send = torch.stack([torch.cat([nat[q], nat[2 * cp - 1 - q]]) for q in range(cp)])
            recv = _AllToAll.apply(send, group)         # block q: my 2h tokens, rank q's columns
            cols.append(torch.cat(recv.unbind(0), dim=1))  # [2h, w]
        rows.append(torch.cat(cols, dim=1))
    if not rows:  # no tokens: an empty result that still depends on x (as in thd_cp_to_hp)
        return x[:0].repeat(1, cp)
    return torch.cat(rows)
