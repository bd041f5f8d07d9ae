#!/usr/bin/env python3
"""Issue 11, design (b) probe: fp8 wgmma MXFP8 grouped GEMM with per-32-K-block promotion
(tilekernels/moe/cute_gemm_fp8.py) beside design (a) and torch, same inputs, one run.

    python3 benchmarks/moe_fp8_probe.py [--out DIR] [--sets g8,g32] [--gemms fc1,fc2]
                                        [--cfgs default,carry,...] [--rep MS] [--no-check] [--sass]

Shapes (groups of equal size, ragged offsets on the device): ``g8``: G=8, 4096 tokens per
expert, H=7168, F=2048; ``g32``: G=32, 1024 tokens, H=4096, F=1536. GEMMs: ``fc1`` fwd
y[M, 2F] = X[M, H] . W1[g][2F, H]^T (N=2F, K=H); ``fc2`` fwd y[M, H] = A[M, F] . W2[g][H, F]^T
(N=H, K=F). Operands are MXFP8 (rowwise e4m3 + E8M0 along K) of random data.

Rows per GEMM, each timed with triton.testing.do_bench (median), TFLOP/s = 2 M N K / t:
  b:<cfg>    design (b), one row per config of --cfgs (names below or key=val[+key=val]);
             "p128" / "acc_only" / "col_only" are measurement-only modes (wrong results):
             promotion per 128 (DeepGEMM's granularity), no promotion at all, and promotion
             per 32 by one FFMA per element (the column scale only: what a free scale
             product would leave)
  a          design (a): cute_grouped_gemm.gemm_fwd_into (dequant to bf16, bf16 wgmma)
  bf16       torch._grouped_mm on the dequantized bf16 operands
  fp8row     torch._scaled_grouped_mm, e4m3 with per-row fp32 scales (not MXFP8)

Checks (not --no-check): every mx32 config's bf16 output against design (a)'s fp32 output
(relative error; both are exact products, fp32 sums) and, on 256 rows of each group, against
float64. Writes moe_fp8_probe.json to --out (default $OUT or .); prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from _gpu import bench  # noqa: E402

from tilekernels.moe import cute_gemm_fp8 as f8  # noqa: E402
from tilekernels.moe import cute_grouped_gemm as gg  # noqa: E402
from tilekernels.moe import mxfp8 as mx  # noqa: E402
from tilekernels.testing import rel_err  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
SETS = {"g8": dict(G=8, tokens=4096, H=7168, F=2048), "g32": dict(G=32, tokens=1024, H=4096, F=1536)}
CFGS = {
    "default": {}, "tmp1": dict(tmp_bufs=1), "n64": dict(tile_n=64),
    "n64x2": dict(tile_n=64, ctas_per_sm=2), "stages3": dict(stages=3), "stages5": dict(stages=5),
    "raster16": dict(raster=16), "carry": dict(carry=True), "carry5": dict(carry=True, stages=5),
    "p128": dict(mode="p128"), "acc_only": dict(mode="acc_only"),
    "acc_only_carry": dict(mode="acc_only", carry=True), "col_only_carry": dict(mode="col_only", carry=True),
    "col_only": dict(mode="col_only"),
}
DEFAULT_CFGS = "default,carry,carry5,tmp1,p128,acc_only,acc_only_carry,col_only,col_only_carry"
OUT: dict = {"env": {}, "rows": [], "checks": [], "errors": []}


def parse_cfg(name: str) -> dict:
    if name in CFGS:
        return CFGS[name]
    kw = {}
    for item in name.split("+"):
        k, v = item.split("=")
        kw[k] = v if k == "mode" else int(v)
    return kw




def make_operands(G, tokens, N, K):
    M = G * tokens
    x = torch.randn(M, K, device="cuda")
    xd, xs = mx.quantize_rowwise(x)
    del x
    w = torch.randn(G * N, K, device="cuda") / K ** 0.5
    wd, ws = mx.quantize_rowwise(w)
    del w
    off = torch.arange(G + 1, device="cuda", dtype=torch.int64) * tokens
    return dict(M=M, N=N, K=K, G=G, tokens=tokens, xd=xd.view(torch.uint8), xs=xs,
                wd=wd.view(torch.uint8).view(G, N, K), ws=ws.view(G, N, K // 32), off=off)


def record(shape, gemm, impl, ms, p, extra=None):
    tf = 2.0 * p["M"] * p["N"] * p["K"] / (ms * 1e-3) / 1e12
    row = dict(set=shape, gemm=gemm, impl=impl, ms=ms, tflops=tf, M=p["M"], N=p["N"], K=p["K"], G=p["G"])
    row.update(extra or {})
    OUT["rows"].append(row)
    print(f"{shape:4s} {gemm:4s} {impl:24s} {ms:8.3f} ms {tf:7.1f} TFLOP/s", flush=True)


def check(what, err, limit=1e-2):
    ok = err <= limit
    OUT["checks"].append(dict(what=what, rel_err=err, ok=ok))
    print(f"check {what}: rel err {err:.3e} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def ref_rows(p, rows=256):
    """float64 reference of the first ``rows`` rows of every group: (row index, [R, N])."""
    G, N, t = p["G"], p["N"], p["tokens"]
    idx = torch.cat([torch.arange(rows, device="cuda") + g * t for g in range(G)])
    A = mx.dequantize_rowwise(p["xd"][idx].view(torch.float8_e4m3fn), p["xs"][idx], torch.float64)
    out = torch.empty(G * rows, N, dtype=torch.float64, device="cuda")
    for g in range(G):
        W = mx.dequantize_rowwise(p["wd"][g].view(torch.float8_e4m3fn), p["ws"][g], torch.float64)
        out[g * rows:(g + 1) * rows] = A[g * rows:(g + 1) * rows] @ W.t()
    return idx, out


def run_gemm(shape, gemm, p, cfg_names, rep, do_check):
    M, N, K, G = p["M"], p["N"], p["K"], p["G"]
    args = (p["xd"], p["xs"], p["wd"], p["ws"], p["off"])
    ref_a = ref64 = None
    if do_check:
        ref_a = torch.empty(M, N, dtype=F32, device="cuda")
        gg.gemm_fwd_into(*args, ref_a)
        idx, ref64 = ref_rows(p)
    # design (b), each config
    for name in cfg_names:
        try:
            kw = parse_cfg(name)
            cfg = f8.Fp8GemmCfg.heuristic(G, N, K, **kw)
            out = torch.full((M, N), float("nan"), dtype=BF, device="cuda")
            t0 = time.time()
            f8.gemm_fp8_fwd_into(*args, out, cfg=cfg)
            torch.cuda.synchronize()
            extra = dict(cfg=kw, first_call_s=round(time.time() - t0, 2))
            if do_check and cfg.mode == "mx32":
                e1 = rel_err(out, ref_a)
                e2 = rel_err(out[idx], ref64)
                extra.update(err_vs_a_fp32=e1, err_vs_f64=e2)
                check(f"{shape} {gemm} b:{name} vs design (a) fp32", e1)
                check(f"{shape} {gemm} b:{name} vs float64 (256 rows/group)", e2)
            ms = bench(lambda: f8.gemm_fp8_fwd_into(*args, out, cfg=cfg), rep)
            record(shape, gemm, f"b:{name}", ms, p, extra)
            del out
        except Exception:
            msg = f"{shape} {gemm} b:{name}: {traceback.format_exc(limit=8)}"
            print("ERROR", msg, flush=True)
            OUT["errors"].append(msg)
    # design (a)
    out = torch.empty(M, N, dtype=BF, device="cuda")
    gg.gemm_fwd_into(*args, out)
    record(shape, gemm, "a", bench(lambda: gg.gemm_fwd_into(*args, out), rep), p)
    # torch bf16 grouped GEMM on the dequantized operands
    xb = mx.dequantize_rowwise(p["xd"].view(torch.float8_e4m3fn), p["xs"], BF)
    wb = mx.dequantize_rowwise(p["wd"].view(G * N, K).view(torch.float8_e4m3fn),
                               p["ws"].view(G * N, K // 32), BF).view(G, N, K)
    ends = p["off"][1:].to(torch.int32)
    wbt = wb.transpose(-2, -1)
    record(shape, gemm, "bf16 _grouped_mm", bench(lambda: torch._grouped_mm(xb, wbt, offs=ends), rep), p)
    # torch fp8 rowwise (per-row fp32 scales) on the same values
    try:
        sx = xb.float().abs().amax(-1).clamp(min=1e-12) / 448.0
        xq = (xb.float() / sx[:, None]).to(torch.float8_e4m3fn)
        sw = wb.float().abs().amax(-1).clamp(min=1e-12) / 448.0
        wq = (wb.float() / sw[..., None]).to(torch.float8_e4m3fn)
        wqt = wq.transpose(-2, -1)
        fn = lambda: torch._scaled_grouped_mm(xq, wqt, sx, sw, offs=ends, out_dtype=BF)  # noqa: E731
        fn()
        record(shape, gemm, "fp8row _scaled_grouped_mm", bench(fn, rep), p)
    except Exception:
        msg = f"{shape} {gemm} fp8row: {traceback.format_exc(limit=6)}"
        print("ERROR", msg, flush=True)
        OUT["errors"].append(msg)


def sass_report(cfg_names):
    """ptxas warnings (wgmma serialization) and the SASS wgmma / wait counts of each config at
    the g8 FC1 dims (needs ptxas and cuobjdump on the PATH)."""
    import re
    import subprocess
    import tempfile

    for name in cfg_names:
        cfg = f8.Fp8GemmCfg.heuristic(8, 4096, 7168, **parse_cfg(name))
        art = f8.gemm_fp8_launch(8, 4096, 7168, BF, torch.int64, cfg).export("sm_90a")
        with tempfile.TemporaryDirectory() as d:
            ptx, cub = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
            open(ptx, "w").write(art.ptx)
            open(cub, "wb").write(art.cubin)
            px = subprocess.run(["ptxas", "-arch=sm_90a", "-v", ptx, "-o", os.path.join(d, "p.cubin")],
                                capture_output=True, text=True)
            sass = subprocess.run(["cuobjdump", "-sass", cub], capture_output=True, text=True).stdout
        warn = [ln.strip() for ln in px.stderr.splitlines() if "wgmma" in ln.lower() or "spill" in ln.lower()]
        depbar = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", sass)
        info = dict(cfg=name, hgmma=sass.count("HGMMA"), depbar={v: depbar.count(v) for v in set(depbar)},
                    ptxas=warn[:4])
        OUT.setdefault("sass", []).append(info)
        print("sass", info, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sets", default="g8,g32")
    ap.add_argument("--gemms", default="fc1,fc2")
    ap.add_argument("--cfgs", default=DEFAULT_CFGS)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--sass", action="store_true", help="ptxas warnings and SASS wgmma waits first")
    a = ap.parse_args()
    torch.manual_seed(0)
    OUT["env"] = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                      date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), args=vars(a))
    cfg_names = [c for c in a.cfgs.split(",") if c]
    if a.sass:
        try:
            sass_report(cfg_names)
        except Exception:
            OUT["errors"].append(f"sass: {traceback.format_exc(limit=4)}")
            print("ERROR sass", traceback.format_exc(limit=4), flush=True)
    for shape in a.sets.split(","):
        s = SETS[shape]
        for gemm in a.gemms.split(","):
            N, K = (2 * s["F"], s["H"]) if gemm == "fc1" else (s["H"], s["F"])
            p = make_operands(s["G"], s["tokens"], N, K)
            run_gemm(shape, gemm, p, cfg_names, a.rep, not a.no_check)
            del p
            torch.cuda.empty_cache()
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "moe_fp8_probe.json"), "w") as fh:   # after every GEMM
                json.dump(OUT, fh, indent=1)
    print("\n== design (b) probe (do_bench median; TFLOP/s = 2MNK/t) ==")
    print(f"{'set':4s} {'gemm':4s} {'impl':26s} {'ms':>8s} {'TFLOP/s':>8s} {'err':>9s}")
    for r in OUT["rows"]:
        err = r.get("err_vs_f64")
        print(f"{r['set']:4s} {r['gemm']:4s} {r['impl']:26s} {r['ms']:8.3f} {r['tflops']:8.1f} "
              f"{'' if err is None else f'{err:.2e}':>9s}")
    bad = [c for c in OUT["checks"] if not c["ok"]]
    print(f"checks: {len(OUT['checks']) - len(bad)} ok, {len(bad)} failed; errors: {len(OUT['errors'])}")
    return 1 if bad or OUT["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
