"""tk-bench cases for the THD context-parallel family.

* ``thd_cp_a2a_perm`` needs no process group: it is benched at the cp it
  would serve (CUDA: cp=8 over T_global = 8 x 32768 tokens in 64 sequences;
  CPU: cp=4, 4096 tokens), with the Qwen3-Next GDN sections.
* ``thd_cp_to_hp`` / ``thd_hp_to_cp`` are collectives: tk-bench is one
  process, so they run on a world-size-1 group (cp = 1; gloo on CPU, nccl on
  CUDA), which ``make`` initializes as the default group if none exists (a
  FileStore in a temp dir; nothing leaves the machine). At cp = 1 the
  all_to_all is a local copy, so these rows measure the fused packing and
  unpacking (two copies around it: the cutile pack/unpack kernels on a GPU, the
  torch gathers on a CPU) plus that copy, not the network; the per-kernel
  numbers at cp = 2, 4, 8 are benchmarks/cp_pack_check.py; the multi-rank path is
  covered by tests/cp/test_cp_a2a.py. Headline on CUDA: Qwen3-Next GDN in_proj
  output, D = 12352 (q,k = 2048, v,z = 4096, b,a = 32), 8 sequences of 4096
  tokens (T = 32768), bf16.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import torch

from tilekernels.benchcase import BenchCase


def sections(d) -> list[int]:
    """q, k, v, z, b, a widths (Megatron's GDN in_proj layout)."""
    qk, vz = d["Hk"] * d["dk"], d["Hv"] * d["dv"]
    return [qk, qk, vz, vz, d["Hv"], d["Hv"]]


def cu_seqlens(T: int, N: int, multiple: int, device) -> torch.Tensor:
    """N sequences of varied lengths (multiples of ``multiple``) summing to T.

    T must be a multiple of ``multiple`` (refused otherwise: rounding it down would run, and record, another
    shape than the one asked for); lengths vary deterministically around T/N.
    """
    if T % multiple:
        raise ValueError(f"cp bench case: T={T} must be a multiple of {multiple} (every sequence length is a "
                         f"multiple of 2*cp)")
    units = T // multiple
    g = torch.Generator().manual_seed(0)
    w = torch.rand(N, generator=g) + 0.5
    lens = (w / w.sum() * units).floor().to(torch.int64)
    lens[-1] += units - int(lens.sum())
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lens * multiple, 0)])
    return cu.to(torch.int32).to(device)


def _single_process_group(device: torch.device) -> None:
    """A world-size-1 default process group (gloo on CPU, nccl on CUDA), once."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError("tk-bench runs the cp all_to_all on a world-size-1 group; "
                               f"this process already has a default group of {dist.get_world_size()}")
        return
    folder = tempfile.mkdtemp(prefix="tk-bench-cp-")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"file://{os.path.join(folder, 'store')}", rank=0, world_size=1)
    atexit.register(_end_group, folder)


def _end_group(folder: str) -> None:
    """At exit: destroy the group made above (NCCL warns at exit of a group never destroyed: tk-bench on an H100,
    session 57) and remove its file store's folder."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    shutil.rmtree(folder, ignore_errors=True)


def _perm_inputs(d, device):
    cu = cu_seqlens(d["T"], d["N"], 2 * d["cp"], device)
    return (cu,), {"cp": d["cp"], "split_sections": sections(d)}


def _a2a_inputs(d, device):
    _single_process_group(device)
    cu = cu_seqlens(d["T"], d["N"], 2, device)
    width = sum(sections(d))  # cp = 1: both sides [T, D], so one maker serves both directions
    x = torch.randn(d["T"], width, device=device).to(torch.bfloat16)
    return (x, cu), {"split_sections": sections(d)}


def _a2a_bytes(d) -> int:
    # read x (bf16), write out (bf16), read the int64 token map (torch backend; cp = 1: both sides [T, D])
    return 2 * 2 * d["T"] * sum(sections(d)) + 8 * d["T"]


def cases(device_type: str) -> list[BenchCase]:
    big = device_type == "cuda"
    gdn = {"Hk": 16, "Hv": 32, "dk": 128, "dv": 128} if big else {"Hk": 2, "Hv": 4, "dk": 32, "dv": 32}
    perm_dims = dict(gdn, T=8 * 32768, N=64, cp=8) if big else dict(gdn, T=4096, N=16, cp=4)
    a2a_dims = dict(gdn, T=32768, N=8) if big else dict(gdn, T=1024, N=8)
    out = [
        BenchCase(
            op="thd_cp_a2a_perm", dims=perm_dims, make=_perm_inputs, dtype="int64",
            # read cu_seqlens (int32); write token_perm, token_inv [T] and feature maps [D] (int64)
            bytes_fwd=lambda d: 4 * (d["N"] + 1) + 2 * 8 * d["T"] + 2 * 8 * sum(sections(d)),
        ),
    ]
    for op in ("thd_cp_to_hp", "thd_hp_to_cp"):
        out.append(BenchCase(
            op=op, dims=a2a_dims, make=_a2a_inputs, variant="world=1",
            bytes_fwd=_a2a_bytes,
            bytes_bwd=_a2a_bytes,  # the backward is the other direction: same traffic
            grad_inputs=("x",), exact=True,  # pure copies both ways (OPS.md): bit for bit
        ))
    return out
