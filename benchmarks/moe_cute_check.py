#!/usr/bin/env python3
"""GPU timing of the CuTe DSL MXFP8 quantize / dequantize kernels (run on the device host).

From the repository root:

    python3 -m pytest -q tests/moe/test_mxfp8_cute.py          # correctness first
    python3 benchmarks/moe_cute_check.py [--R 32768 --K 7168] [--sweep] [--no-compile] [--json FILE]

For x [R, K] bf16 and fp32 and each axis (rowwise, columnwise, both), times
(triton.testing.do_bench, median ms) the CuTe kernel, torch's own path
(tilekernels.moe.mxfp8.quantize, eager) and torch.compile of it, and prints GB/s
and % of the copy bandwidth (--copy-gbps, default the H200's 4270; a measured
clone bandwidth is printed beside it). Bytes are counted by hand: x read once,
each axis' data (R*K bytes) and scales (R*K/32 bytes) written once. Dequantize:
data and scales read, out written. Where the default is the pipelined kernel
(cute_quantize_pipe), the shared-memory kernel's config (the default before it) is
timed beside it on the same inputs ("old default"). Every cute output is checked
bit for bit against the torch path (a line says MISMATCH otherwise). --sweep also
times config variants of the shared-memory kernel (columns per thread, CTA
threads) and of the pipelined kernel (warps, stages, grid_x, min_blocks), each
checked bit for bit too. With --sweep or --wait-for FILE all launches are compiled
first, then the timing waits until FILE exists (the session's other GPU work done).
Compile times (first call) are printed too.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]

import torch  # noqa: E402

from _gpu import bench, wait_for  # noqa: E402

from tilekernels import _cute as C  # noqa: E402
from tilekernels.moe import cute_quantize as Q  # noqa: E402
from tilekernels.moe import mxfp8 as mx  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
AXES = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}




def outs(R, K, row, col, dev="cuda"):
    e = torch.float8_e4m3fn
    return (torch.empty(R, K, dtype=e, device=dev) if row else None,
            torch.empty(R, K // 32, dtype=torch.uint8, device=dev) if row else None,
            torch.empty(R, K, dtype=e, device=dev) if col else None,
            torch.empty(R // 32, K, dtype=torch.uint8, device=dev) if col else None)


def quant_bytes(R, K, dtype, row, col):
    per_axis = R * K + R * K // 32
    return R * K * torch.empty((), dtype=dtype).element_size() + per_axis * (int(row) + int(col))


def line(rec, copy_gbps):
    gbps = rec["bytes"] / rec["ms"] / 1e6
    rec["gbps"], rec["pct_copy"] = gbps, 100 * gbps / copy_gbps
    bad = "  MISMATCH against torch" if rec.get("exact") is False else ""
    print(f"  {rec['what']:<56} {rec['ms']*1e3:9.1f} us {gbps:8.0f} GB/s {rec['pct_copy']:5.1f}%{bad}", flush=True)
    return rec


def run(args):
    R, K = args.R, args.K
    dev = torch.cuda.get_device_name()
    print(f"device {dev}, arch {C.device_arch()}, R={R} K={K}", flush=True)
    recs, sweeps = [], []
    x0 = torch.randn(R, K, device="cuda")
    ms = bench(lambda: x0.clone())
    print(f"  clone fp32 (read+write {2*x0.numel()*4/1e9:.2f} GB): {2*x0.numel()*4/ms/1e6:.0f} GB/s "
          f"(copy reference {args.copy_gbps:.0f})", flush=True)
    for dtype in (BF, F32):
        x = (torch.randn(R, K, device="cuda") * 3).to(dtype)
        for axis, (row, col) in AXES.items():
            o = outs(R, K, row, col)
            nbytes = quant_bytes(R, K, dtype, row, col)
            tag = f"quantize {axis} {str(dtype)[6:]}"
            t0 = time.perf_counter()
            Q.quantize_into(x, *o)
            torch.cuda.synchronize()
            print(f"{tag}: first call (compile) {time.perf_counter()-t0:.1f} s", flush=True)
            want = mx.quantize(x, axis)
            want = {"rowwise": (*want, None, None), "columnwise": (None, None, *want), "both": want}[axis]
            rec = dict(what=f"{tag} cute", ms=bench(lambda: Q.quantize_into(x, *o)), bytes=nbytes,
                       exact=same(o, want), cfg=repr(Q.quant_launch(dtype, K, row, col).cfg))
            recs.append(line(rec, args.copy_gbps))
            old = Q.QuantCfg.heuristic(K, dtype, row, col)
            if old != Q.quant_launch(dtype, K, row, col).cfg:
                ln = Q.launch_for(old, dtype)
                got = outs(R, K, row, col)
                ln.run(x, *got, R)
                recs.append(line(dict(what=f"{tag} old default", ms=bench(lambda: ln.run(x, *got, R)),
                                      bytes=nbytes, exact=same(got, want), cfg=repr(old)), args.copy_gbps))
            recs.append(line(dict(what=f"{tag} torch eager", ms=bench(lambda: mx.quantize(x, axis), rep=50),
                                  bytes=nbytes), args.copy_gbps))
            if not args.no_compile:
                try:
                    f = torch.compile(lambda t: mx.quantize(t, axis), dynamic=False)
                    f(x)
                    recs.append(line(dict(what=f"{tag} torch.compile", ms=bench(lambda: f(x)), bytes=nbytes),
                                     args.copy_gbps))
                except Exception:
                    print("  torch.compile failed:", traceback.format_exc(limit=3), flush=True)
            if args.sweep and axis in args.sweep_axes.split(","):
                sweeps.append((x, row, col, want, nbytes, tag))
        for axis in ("rowwise", "columnwise"):
            d, s = mx.quantize(x0, axis)
            out = torch.empty(R, K, dtype=dtype, device="cuda")
            nbytes = R * K + s.numel() + R * K * out.element_size()
            Q.dequantize_into(d, s, out, axis)
            recs.append(line(dict(what=f"dequantize {axis} -> {str(dtype)[6:]} cute",
                                  ms=bench(lambda: Q.dequantize_into(d, s, out, axis)), bytes=nbytes),
                             args.copy_gbps))
            recs.append(line(dict(what=f"dequantize {axis} -> {str(dtype)[6:]} torch eager",
                                  ms=bench(lambda: mx.dequantize(d, s, axis, dtype), rep=50), bytes=nbytes),
                             args.copy_gbps))
    for (x, row, col, want, nbytes, tag) in sweeps:
        recs += sweep(x, row, col, want, sweep_cfgs(x, row, col, args.sweep_smem_only, args.sweep_kinds.split(",")),
                      nbytes, tag, args.copy_gbps)
    return recs


def precompile(args):
    """Compile every launch the run times (defaults, old defaults, sweep configs: CPU work),
    then wait for --wait-for (other GPU work of the session done) before any timing."""
    R, K = args.R, args.K
    t0 = time.perf_counter()
    n = 0
    for dtype in (BF, F32):
        x = torch.empty(R, K, dtype=dtype, device="meta")
        for axis, (row, col) in AXES.items():
            cfgs = [Q.quant_launch(dtype, K, row, col).cfg, Q.QuantCfg.heuristic(K, dtype, row, col)]
            if args.sweep and axis in args.sweep_axes.split(","):
                cfgs += sweep_cfgs(x, row, col, args.sweep_smem_only, args.sweep_kinds.split(","))
            for cfg in dict.fromkeys(cfgs):
                try:
                    Q.launch_for(cfg, dtype).compile(C.device_arch())
                    n += 1
                except Exception:
                    print(f"  compile {cfg} failed:", traceback.format_exc(limit=3), flush=True)
    print(f"precompiled {n} launches in {time.perf_counter() - t0:.0f} s", flush=True)
    wait_for(args.wait_for, args.wait_max)


def same(got, want) -> bool:
    """All outputs byte-equal (absent ones absent in both)."""
    return all((g is None) == (w is None) and (g is None or torch.equal(g.view(torch.uint8), w.view(torch.uint8)))
               for g, w in zip(got, want))


def sweep_cfgs(x, row, col, smem_only=False, kinds=("smem", "regs", "pipe")):
    """The configs a sweep times: the shared-memory kernel (tile widths, CTA sizes; the
    register kernel too unless smem_only) and, for the rowwise output, the pipelined kernel
    (column blocks per warp tile, warps 4 / 8, stages 2 / 3, ~4 tiles a warp), the default
    excluded."""
    R, K = x.shape
    elt = x.element_size()
    base = Q.QuantCfg.heuristic(K, x.dtype, row, col)
    cfgs = []
    for threads in () if "smem" not in kinds else (64, 128) if smem_only else (64, 128, 256):
        for vec in (2, 4) if smem_only else (1, 2, 4):
            bk = threads * vec
            if K % (16 // elt) == 0 and bk % 32 == 0 and 32 * (bk + 16 // elt) * elt <= 48 * 1024:
                for direct in ((False, True) if row and not col else (False,)):
                    cfgs.append(dataclasses.replace(base, vec=vec, threads=threads, smem=True, direct=direct))
    for threads in () if smem_only or "regs" not in kinds else (64, 128):           # register kernel
        for vec in (v for v in (1, 2, 4, 8) if v * elt <= 16 and K % v == 0):
            cfgs.append(dataclasses.replace(base, vec=vec, threads=threads, smem=False))
    if row and K % 32 == 0 and "pipe" in kinds:
        pb = Q.PipeCfg.heuristic(K, x.dtype, row, col)
        for nbt in (n for n in (1, 2, 4) if n <= 8 // elt and (K // 32) % n == 0):
            for warps in (4, 8):
                for stages in (2, 3):
                    nt = K // 32 // nbt
                    c = dataclasses.replace(pb, warps=warps, stages=stages, nbt=nbt,
                                            grid_x=max(1, nt // (warps * 4)))
                    if c.smem_bytes() <= 200 * 1024:
                        cfgs.append(c)
        cfgs += [dataclasses.replace(pb, unroll=u) for u in (2, 8, 16)]
    default = Q.quant_launch(x.dtype, K, row, col).cfg
    return [c for c in dict.fromkeys(cfgs) if c != default]


def sweep(x, row, col, want, cfgs, nbytes, tag, copy_gbps):
    """Time each config (compiled already) on the same x, after checking it bit for bit
    against the torch path."""
    R, K = x.shape
    recs = []
    for cfg in cfgs:
        if isinstance(cfg, Q.PipeCfg):
            kind = f"pipe nbt={cfg.nbt} w={cfg.warps} st={cfg.stages} gx={cfg.grid_x} u={cfg.unroll}"
        else:
            kind = f"{('direct' if cfg.direct else 'smem') if cfg.smem else 'regs'} vec={cfg.vec} threads={cfg.threads}"
        what = f"{tag} {kind}"
        ln = Q.launch_for(cfg, x.dtype)
        try:
            got = outs(R, K, row, col)
            ln.run(x, *got, R)
            torch.cuda.synchronize()
            ok = same(got, want)
            regs = list(C.cubin_resources(ln.export(C.device_arch()).cubin).values())[0]["regs"]
            rec = dict(what=f"{what} regs={regs}", ms=bench(lambda: ln.run(x, *got, R), rep=100), bytes=nbytes,
                       exact=ok, cfg=repr(cfg))
            line(rec, copy_gbps)
            recs.append(rec)
        except Exception:
            print(f"  {what} failed:", traceback.format_exc(limit=3), flush=True)
    return recs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--R", type=int, default=32768)
    ap.add_argument("--K", type=int, default=7168)
    ap.add_argument("--copy-gbps", type=float, default=4270.0)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-axes", default="rowwise,columnwise,both", help="axes the sweep covers")
    ap.add_argument("--sweep-smem-only", action="store_true",
                    help="sweep the shared-memory kernel only, 64/128 threads x 2/4 columns")
    ap.add_argument("--sweep-kinds", default="smem,regs,pipe", help="kernels the sweep covers")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--wait-for", help="with --sweep: time the sweep only once this file exists")
    ap.add_argument("--wait-max", type=float, default=120.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.sweep or args.wait_for:
        precompile(args)
    recs = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), R=args.R, K=args.K, records=recs), f, indent=1)


if __name__ == "__main__":
    main()
