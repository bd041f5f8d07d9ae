#!/usr/bin/env python3
"""What torch._grouped_mm (bf16) accepts on this GPU, for the predq MXFP8 GEMM path.

Cases, in the layouts tilekernels/moe/gemm_predq.py uses (fwd: 2d x 3d with B transposed,
dgrad: 2d x 3d row-major B, wgrad: 2d x 2d with A column-major): zero-sized groups, group
sizes not multiples of 16, M = 32, one group, 128 groups, one group taking all rows, an fp32
out_dtype, host syncs (set_sync_debug_mode("error")) and an uninitialised output (the
allocator's blocks are NaN-filled first, so a group the kernel skips shows as NaN). Each
result against a float64 per-group reference; prints one line per case and writes
grouped_mm_edges.json to $OUT.
"""
from __future__ import annotations

import json
import os
import traceback

import torch

BF = torch.bfloat16
OUT = os.environ.get("OUT", ".")


def _poison_pool(nbytes=1 << 30):
    t = torch.empty(nbytes // 2, dtype=BF, device="cuda").fill_(float("nan"))
    del t


def case(layout, splits, N=256, K=192, out_dtype=None):
    G, M = len(splits), sum(splits)
    ends = torch.cumsum(torch.tensor(splits, device="cuda"), 0).to(torch.int32)
    _poison_pool()
    if layout == "wgrad":
        a = torch.randn(M, N, device="cuda").to(BF)
        b = torch.randn(M, K, device="cuda").to(BF)
        args = (a.t(), b)
    else:
        a = torch.randn(M, K, device="cuda").to(BF)
        w = torch.randn(G, N, K, device="cuda").to(BF)
        args = (a, w.transpose(-2, -1)) if layout == "fwd" else (a, w.transpose(-2, -1).contiguous())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        kw = dict(offs=ends) if out_dtype is None else dict(offs=ends, out_dtype=out_dtype)
        res = torch._grouped_mm(*args, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    A, B = args[0].double(), args[1].double()
    start, errs, nan_groups = 0, [], []
    for g, m in enumerate(splits):
        if layout == "wgrad":
            ref = A[:, start:start + m] @ B[start:start + m]
            got = res[g].double()
        else:
            ref = A[start:start + m] @ B[g]
            got = res[start:start + m].double()
        if torch.isnan(got).any():
            nan_groups.append(g)
        d = (got - ref).norm().item()
        n = ref.norm().item()
        errs.append(d / n if n > 0 else d)
        start += m
    return dict(out_dtype=str(res.dtype), max_rel_err=max(errs) if errs else 0.0, nan_groups=nan_groups[:8],
                n_nan_groups=len(nan_groups))


def main():
    rows = []
    cases = []
    for layout in ("fwd", "dgrad", "wgrad"):
        z = [32, 0, 96, 0, 64] if layout == "wgrad" else [37, 0, 100, 0, 63]
        cases += [(layout, z, {}), (layout, [32], {}), (layout, [0, 0, 4096, 0], {}),
                  (layout, [(g * 3) % 4 * 32 for g in range(128)] if layout == "wgrad" else
                   [(g * 7) % 5 for g in range(128)], {}),
                  (layout, [0, 0], {}), (layout, [64, 96], dict(out_dtype=torch.float32))]
        if layout != "wgrad":
            cases += [(layout, [1, 7, 15, 17, 33], {}), (layout, [1, 31, 0, 517, 129], dict(N=352, K=224))]
        else:
            cases += [(layout, [8, 24, 40], {}), (layout, [1, 7, 15, 17], {})]
    for layout, splits, kw in cases:
        name = f"{layout} G={len(splits)} splits={splits[:6]}{'...' if len(splits) > 6 else ''} {kw}"
        try:
            r = case(layout, splits, **kw)
            r["ok"] = r["max_rel_err"] < 1e-2 and not r["n_nan_groups"]
        except Exception as e:  # noqa: BLE001
            r = dict(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            traceback.print_exc(limit=2)
            torch.cuda.set_sync_debug_mode("default")
        r["case"] = name
        rows.append(r)
        print(f"grouped_mm {'OK ' if r['ok'] else 'BAD'} {name}: "
              + (r.get("error") or f"rel err {r['max_rel_err']:.2e} NaN groups {r['n_nan_groups']} {r['out_dtype']}"),
              flush=True)
    with open(os.path.join(OUT, "grouped_mm_edges.json"), "w") as f:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
