"""MXFP8 quantize: the pipelined kernel's persistent grid (PipeCfg.ctas) against the default.

    python3 benchmarks/probes/mxfp8_quant_persist.py [--R 32768 --K 7168] [--reps 2]
        [--wait-for FILE --wait-max S] [--json FILE]

For rowwise and both, x bf16 and fp32 (randn * 3, the moe_cute_check.py input): the default
launch (``quant_launch``), the pipelined kernel as committed before the persistent grid
(``--old-module``, a copy of the file, if given) and persistent variants (warps per CTA,
stages, CTAs per SM, column blocks per tile). Every launch is compiled first (CPU), then the
timing waits for --wait-for (the session's other GPU work done). Each output is checked bit
for bit against the torch path (tilekernels.moe.mxfp8) before it is timed; ``--reps`` rounds
time every launch once each, interleaved (run-to-run spread). do_bench median; bytes: x read
once, each axis' data R*K and scales R*K/32 written once; % of the 4.27 TB/s copy ceiling.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

from _gpu import bench, wait_for  # noqa: E402

from tilekernels import _cute as C  # noqa: E402
from tilekernels._glue import sm_count  # noqa: E402
from tilekernels.moe import cute_quantize as Q  # noqa: E402
from tilekernels.moe import mxfp8 as mx  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
COPY_GBPS = 4270.0
COMBOS = [(BF, True, False), (BF, True, True), (F32, True, False), (F32, True, True)]
OLD_PIPE = {(BF, True, False), (BF, True, True), (F32, True, True)}   # on the pipelined kernel at 86ae02d


def variants(dtype, row, col, K, sms):
    """(label, launch) pairs of one (dtype, axes): the default, one CTA per strip, then
    persistent grids (warps, stages, CTAs an SM, unroll); duplicates of the default dropped."""
    base = Q.PipeCfg.heuristic(K, dtype, row, col, sms)
    p = dataclasses.replace(base, grid_x=1, min_blocks=0)
    out = [("default", Q.quant_launch(dtype, K, row, col, True, sms))]
    strips = dataclasses.replace(base, ctas=0, grid_x=max(1, K // 32 // base.nbt // 32))
    if strips != out[0][1].cfg:
        out.append(("pipe ctas=0", Q.launch_for(strips, dtype)))
    for warps, stages, per_sm, unroll in ((8, 2, 1, 4), (8, 3, 1, 4), (8, 2, 1, 8), (6, 2, 2, 4), (4, 3, 2, 4),
                                          (4, 2, 3, 4)):
        c = dataclasses.replace(p, warps=warps, stages=stages, unroll=unroll, ctas=per_sm * sms)
        if c.smem_bytes() * per_sm > 228 * 1024 or c == out[0][1].cfg:
            continue
        out.append((f"persist w={warps} st={stages} u={unroll} ctas={per_sm}x{sms}", Q.launch_for(c, dtype)))
    return out


def old_launch(path, dtype, row, col, K):
    """The committed pipelined kernel's default launch from a copy of its module."""
    spec = importlib.util.spec_from_file_location("qp_old", path)
    m = sys.modules.get("qp_old")
    if m is None:
        m = importlib.util.module_from_spec(spec)
        sys.modules["qp_old"] = m
        spec.loader.exec_module(m)
    cfg = m.PipeCfg.heuristic(K, dtype, row, col)
    return m.pipe_launch(cfg, "moe.cute_quantize_old.quantize")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--R", type=int, default=32768)
    ap.add_argument("--K", type=int, default=7168)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--old-module")
    ap.add_argument("--wait-for")
    ap.add_argument("--wait-max", type=float, default=120.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    R, K = args.R, args.K
    sms = sm_count(torch.device("cuda", torch.cuda.current_device()))
    arch = C.device_arch()
    t0 = time.perf_counter()
    plan = []
    for dtype, row, col in COMBOS:
        vs = variants(dtype, row, col, K, sms)
        if args.old_module and (dtype, row, col) in OLD_PIPE:
            vs.insert(1, ("s6 pipe (old module)", old_launch(args.old_module, dtype, row, col, K)))
        elif (dtype, row, col) not in OLD_PIPE:
            vs.insert(1, ("smem (s6 default)", Q.launch_for(Q.QuantCfg.heuristic(K, dtype, row, col), dtype)))
        for label, ln in vs:
            try:
                ln.compile(arch)
            except Exception:
                print(f"compile failed: {label}", traceback.format_exc(limit=3), flush=True)
        plan.append(((dtype, row, col), vs))
    print(f"precompiled {sum(len(v) for _, v in plan)} launches in {time.perf_counter() - t0:.0f} s", flush=True)
    wait_for(args.wait_for, args.wait_max)
    print(f"device {torch.cuda.get_device_name()}, {sms} SMs, arch {arch}, R={R} K={K}", flush=True)
    x0 = torch.randn(R, K, device="cuda")
    ms = bench(lambda: x0.clone())
    print(f"clone fp32: {2 * x0.numel() * 4 / ms / 1e6:.0f} GB/s (ceiling {COPY_GBPS:.0f})", flush=True)
    x0 = None
    recs = []
    for (dtype, row, col), vs in plan:
        axis = "both" if col else "rowwise"
        tag = f"{axis} {str(dtype)[6:]}"
        x = (torch.randn(R, K, device="cuda") * 3).to(dtype)
        nbytes = R * K * x.element_size() + (R * K + R * K // 32) * (int(row) + int(col))
        want = mx.quantize(x, axis)
        want = (*want, None, None) if not col else want
        live = []
        for label, ln in vs:
            got = (torch.full((R, K), 0x55, dtype=torch.uint8, device="cuda"),
                   torch.full((R, K // 32), 0xAA, dtype=torch.uint8, device="cuda"),
                   torch.full((R, K), 0x55, dtype=torch.uint8, device="cuda") if col else None,
                   torch.full((R // 32, K), 0xAA, dtype=torch.uint8, device="cuda") if col else None)
            try:
                if label == "default":
                    Q.quantize_into(x, *got)
                else:
                    ln.run(x, *got, R)
                torch.cuda.synchronize()
            except Exception:
                print(f"  {tag} {label} failed:", traceback.format_exc(limit=3), flush=True)
                continue
            exact = all((g is None) == (w is None) and (g is None or torch.equal(g, w.view(torch.uint8)))
                        for g, w in zip(got, want))
            regs = list(C.cubin_resources(ln.export(arch).cubin).values())[0]["regs"]
            live.append(dict(what=f"{tag} {label}", ln=ln, got=got, exact=exact, regs=regs, ms=[]))
        for _ in range(args.reps):
            for rec in live:
                if rec["what"].endswith(" default"):
                    g = rec["got"]
                    rec["ms"].append(bench(lambda: Q.quantize_into(x, *g), rep=100))
                else:
                    ln, g = rec["ln"], rec["got"]
                    rec["ms"].append(bench(lambda: ln.run(x, *g, R), rep=100))
        for rec in live:
            pct = [100 * nbytes / m / 1e6 / COPY_GBPS for m in rec["ms"]]
            bad = "" if rec["exact"] else "  MISMATCH against torch"
            print(f"  {rec['what']:<52} regs={rec['regs']:3d} "
                  + " ".join(f"{m * 1e3:7.1f} us {p:5.1f}%" for m, p in zip(rec["ms"], pct)) + bad, flush=True)
            recs.append(dict(what=rec["what"], cfg=repr(rec["ln"].cfg), regs=rec["regs"], exact=rec["exact"],
                             us=[m * 1e3 for m in rec["ms"]], pct_copy=pct, bytes=nbytes))
        x = want = live = None
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
