"""Index maps of the THD context-parallel all-to-all (vectorized, any device).

Zigzag layout: with ``cp`` ranks, every packed sequence i (length L_i, a
multiple of 2*cp) is cut into 2*cp chunks of h_i = L_i / (2*cp) tokens; rank r
holds chunks r and 2*cp-1-r of every sequence, in sequence order, so its local
copy of sequence i starts at cu_seqlens[i] / cp. The *rank-major* order of the
global tokens is rank 0's local tokens, then rank 1's, ... (what one all_to_all
of the local tensors delivers on the head-parallel side).

Conventions (the op ``thd_cp_a2a_perm`` returns exactly these):

* ``token_perm[j]`` = natural packed index of the j-th rank-major token, so
  ``x_rank_major = x_natural[token_perm]``;
* ``token_inv[p]`` = rank-major position of natural token p, so
  ``x_natural = x_rank_major[token_inv]``;
* ``feature_perm[k]`` = section-major column of the k-th rank-major column: the
  rank-major feature order is, for r = 0..cp-1, the r-th 1/cp of every section
  in section order; ``x[:, feature_perm]`` puts a section-major tensor in that
  order and its r-th 1/cp block is what head-parallel rank r owns;
* ``feature_inv[c]`` = rank-major position of section-major column c.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch
from torch import Tensor


class A2APerm(NamedTuple):
    """The result of ``thd_cp_a2a_perm``: four int64 index maps (see the module doc).

    token_perm, token_inv [T_global]; feature_perm, feature_inv [D = sum(split_sections)]
    or None when no split_sections were given.
    """
    token_perm: Tensor
    token_inv: Tensor
    feature_perm: Optional[Tensor]
    feature_inv: Optional[Tensor]


def inverse(perm: Tensor) -> Tensor:
    """inv with inv[perm[j]] = j (perm a permutation of 0..n-1, int64)."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), dtype=perm.dtype, device=perm.device)
    return inv


def token_perm(cu_seqlens: Tensor, cp: int, total: Optional[int] = None) -> tuple[Tensor, Tensor]:
    """(token_perm, token_inv) [T_global] int64 on cu_seqlens' device.

    cu_seqlens [N+1] int32/int64, starts at 0, nondecreasing, every length a
    multiple of 2*cp (not re-checked here: the spec does that). ``total`` =
    cu_seqlens[-1] when the caller knows it: then nothing is read on the host (tensor
    ops on cu_seqlens' device only); None reads it (one sync for a GPU cu_seqlens).
    """
    cu = cu_seqlens.to(torch.int64)
    dev = cu.device
    total = int(cu[-1]) if total is None else int(total)
    if total == 0:
        empty = torch.empty(0, dtype=torch.int64, device=dev)
        return empty, empty.clone()
    t_local = total // cp
    j = torch.arange(total, dtype=torch.int64, device=dev)
    rank = j // t_local
    local = j - rank * t_local
    local_cu = cu // cp
    # the sequence a local position falls in: the first whose local end exceeds it
    # (zero-length sequences end where they start and are never chosen)
    seq = torch.searchsorted(local_cu[1:], local, right=True)
    half = ((cu[1:] - cu[:-1]) // (2 * cp))[seq]
    offset = local - local_cu[seq]
    second = offset >= half                       # in the rank's 2nd chunk of this sequence
    chunk = torch.where(second, 2 * cp - 1 - rank, rank)
    perm = cu[seq] + chunk * half + (offset - second.to(torch.int64) * half)
    return perm, inverse(perm)


def feature_perm(split_sections: Sequence[int], cp: int,
                 device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """(feature_perm, feature_inv) [sum(split_sections)] int64 on ``device``.

    Every section width must be a multiple of cp (the spec checks it). The widths are host ints, so the maps are
    built on ``device`` by one arange a section: no host tensor is copied in (a pageable host-to-device copy is
    refused inside a CUDA graph capture, and the op's total_tokens form is capturable).
    """
    widths = [int(w) for w in split_sections]
    if not widths:
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return empty, empty.clone()
    # section s as [cp, w_s / cp]: row r is the r-th 1/cp of its columns; the rows side by side in section order
    # are the rank-major order (rank 0's part of every section, then rank 1's, ...)
    blocks, start = [], 0
    for w in widths:
        blocks.append(torch.arange(start, start + w, dtype=torch.int64, device=device).view(cp, w // cp))
        start += w
    perm = torch.cat(blocks, dim=1).reshape(-1)
    return perm, inverse(perm)


def a2a_perm(cu_seqlens: Tensor, cp: int, split_sections: Optional[Sequence[int]] = None) -> A2APerm:
    """All four maps; the feature maps are None without split_sections."""
    tp, ti = token_perm(cu_seqlens, cp)
    if split_sections is None:
        return A2APerm(tp, ti, None, None)
    fp, fi = feature_perm(split_sections, cp, cu_seqlens.device)
    return A2APerm(tp, ti, fp, fi)
