#!/usr/bin/env python3
"""GPU check and timing of the CuTe DSL MXFP8 grouped GEMM (tilekernels/moe/cute_grouped_gemm.py).

    python3 benchmarks/moe_gemm_check.py [--out DIR] [--sets headline,g32] [--no-check]
                                          [--no-sweep] [--rep MS]

For each shape set (``headline``: G=8, 4096 tokens per expert, H=7168, F=2048; ``g32``: G=32,
1024 tokens per expert, H=4096, F=1536; groups of equal size) and each of the six GEMMs of the
MXFP8 MLP:

  fc1_fwd    y[M, 2F]  = X[M, H] . W1[g][2F, H]^T           (fwd,   N=2F, K=H)
  fc2_fwd    y[M, H]   = A[M, F] . W2[g][H, F]^T            (fwd,   N=H,  K=F)
  fc2_dgrad  dA[M, F]  = dY[M, H] . W2[g][H, F]             (dgrad, N=H,  K=F)
  fc1_dgrad  dX[M, H]  = dH[M, 2F] . W1[g][2F, H]           (dgrad, N=2F, K=H)
  fc2_wgrad  dW2[g]    = dY_g^T[H, m_g] . A_g[m_g, F]       (wgrad, N=H,  K=F)
  fc1_wgrad  dW1[g]    = dH_g^T[2F, m_g] . X_g[m_g, H]      (wgrad, N=2F, K=H)

it checks the CuTe kernel (bf16 out) against a float64 reference of the same MXFP8 math
(relative error ||out - ref|| / ||ref||, limit 1e-2), then times it with
triton.testing.do_bench (median) beside torch's bf16 ``torch._grouped_mm`` on the dequantized
bf16 operands (same groups; int32 end offsets), and prints TFLOP/s with flops = 2 * M * N * K
counted by hand, and the ``kernel="predq"`` path (tilekernels/moe/gemm_predq.py: one dequantize
pass per operand, then torch._grouped_mm; its own error check and time, which include the
dequant passes and the copy into ``out``; ``--no-predq`` skips it). ``--sweep`` (default on) also times other launch configs of each GEMM
(persistent CTAs, loads after the wgmma issue, tile 128 x 128 with one or two CTAs per SM,
hardware e4m3 convert, raster bands, 4 buffers), each first compared bitwise with the
default config's output (the k order of every output's sum is the same, so they must agree).
``--sweep-set ws`` sweeps the warp-specialized kernel (tilekernels/moe/cute_gemm_ws.py,
``kernel="ws"``) instead; ``--precompile`` compiles every config first (CPU only) and
``--wait-for FILE`` then waits for FILE (other GPU work done) before timing.
``--bf16-kernel`` (fwd / dgrad GEMMs) also checks and times the bf16-operand TMA kernel
(tilekernels/moe/cute_gemm_bf16.py) on the dequantized bf16 operands with fp32 output (limit
1e-5, fp32's tolerance) beside torch._grouped_mm (bf16 out) on the same operands and, for the
GEMMs named in ``--dq-fp32``, the mainloop-dequant kernel with fp32 output (the path the fused
MLP's fp32 intermediates took before); ``--bf16-out`` adds the kernel's bf16 output beside
torch._grouped_mm + the copy into ``out``; ``--only-bf16`` skips everything else. Writes
``moe_gemm_check.json`` to --out (default $OUT or .). Exit status 1 if a check failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from _gpu import bench, device_env, log_error  # noqa: E402

from tilekernels.moe import cute_grouped_gemm as gg  # noqa: E402
from tilekernels.moe import gemm_predq as pq  # noqa: E402
from tilekernels.moe import mxfp8 as mx  # noqa: E402

BF, F32, U8 = torch.bfloat16, torch.float32, torch.uint8
RESULTS: dict = {"env": {}, "records": [], "sweeps": [], "errors": [], "checks": [], "bf16": []}
SETS = {
    "headline": dict(G=8, tokens=4096, H=7168, F=2048),
    "g32": dict(G=32, tokens=1024, H=4096, F=1536),
}
SWEEP = [dict(persistent=True), dict(epi_smem=True), dict(epi_smem=False), dict(persistent=True, epi_smem=True),
         dict(early_loads=False), dict(persistent=True, epi_smem=True, early_loads=False),
         dict(tile_n=128, ctas_per_sm=2), dict(tile_n=128, ctas_per_sm=2, epi_smem=True),
         dict(tile_n=128, ctas_per_sm=2, persistent=True, epi_smem=True), dict(cvt="hw")]
SWEEP_MORE = [dict(tile_n=128), dict(raster=1), dict(raster=16), dict(bufs=4)]
# --sweep-set ws: the warp-specialized kernel (cute_gemm_ws.py) beside the two-warpgroup one;
# "dq" is this module's kernel with the heuristic's other fields (its default when kernel="ws"
# becomes the default somewhere)
WS = dict(kernel="ws", persistent=True, epi_smem=False, bufs=4)
P2 = dict(WS, tile_n=128, producers=2, bufs=6)   # 2 producer warpgroups (128 registers a thread)
SWEEP_WS = [dict(WS, bufs=3), dict(WS, bufs=3, early_loads=False), P2,
            dict(kernel="dq")]


log_err = functools.partial(log_error, RESULTS["errors"], limit=12)


def check(what, ok, detail=""):
    RESULTS["checks"].append({"what": what, "ok": bool(ok), "detail": detail})
    print(f"check {what}: {'ok' if ok else 'MISMATCH'} {detail}", flush=True)


def rel_err(out, ref):
    from tilekernels.testing import rel_err as _re

    return _re(out, ref)


# ------------------------------------------------------------------ problems


def _rand(R, C, scale=1.0):
    return torch.randn(R, C, device="cuda") * scale


def _q_rows(x):
    d, s = mx.quantize_rowwise(x)
    return d.view(U8), s


def _q_cols(x):
    d, s = mx.quantize_columnwise(x)
    return d.view(U8), s


def _deq_rows(d, s, dtype):
    return mx.dequantize_rowwise(d.view(torch.float8_e4m3fn), s, dtype)


def _deq_cols(d, s, dtype):
    return mx.dequantize_columnwise(d.view(torch.float8_e4m3fn), s, dtype)


def problem(kind: str, G: int, tokens: int, N: int, K: int):
    """Operands of one GEMM (weights [G, N, K]) with equal groups of ``tokens`` rows.
    Returns dict(run(out, cfg), out_shape, flops, ref() -> float64, peer() -> bf16 grouped_mm)."""
    M = G * tokens
    splits = torch.full((G,), tokens, dtype=torch.int64, device="cuda")
    offsets = torch.cat([splits.new_zeros(1), torch.cumsum(splits, 0)])
    ends32 = offsets[1:].to(torch.int32)
    flops = 2 * M * N * K
    if kind == "fwd":
        a = _q_rows(_rand(M, K))
        b = _q_rows(_rand(G * N, K, K ** -0.5))
        b3 = (b[0].view(G, N, K), b[1].view(G, N, K // 32))

        args = (*a, *b3, offsets)

        def run(out, cfg=None):
            gg.gemm_fwd_into(*a, *b3, offsets, out, cfg=cfg)

        def ref():
            A, W = _deq_rows(*a, torch.float64), _deq_rows(*b, torch.float64).view(G, N, K)
            return torch.cat([A[g * tokens:(g + 1) * tokens] @ W[g].t() for g in range(G)])

        def peer_args():
            A, W = _deq_rows(*a, BF), _deq_rows(*b, BF).view(G, N, K)
            return A, W.transpose(-2, -1)
        shape = (M, N)
    elif kind == "dgrad":
        a = _q_rows(_rand(M, N))
        w = _q_cols(_rand(G * N, K, N ** -0.5))
        b3 = (w[0].view(G, N, K), w[1].view(G, N // 32, K))

        args = (*a, *b3, offsets)

        def run(out, cfg=None):
            gg.gemm_dgrad_into(*a, *b3, offsets, out, cfg=cfg)

        def ref():
            A, W = _deq_rows(*a, torch.float64), _deq_cols(*w, torch.float64).view(G, N, K)
            return torch.cat([A[g * tokens:(g + 1) * tokens] @ W[g] for g in range(G)])

        def peer_args():
            return _deq_rows(*a, BF), _deq_cols(*w, BF).view(G, N, K)
        shape = (M, K)
    else:
        a = _q_cols(_rand(M, N))
        b = _q_cols(_rand(M, K))

        args = (*a, *b, offsets)

        def run(out, cfg=None):
            gg.gemm_wgrad_into(*a, *b, offsets, out, cfg=cfg)

        def ref():
            DY, X = _deq_cols(*a, torch.float64), _deq_cols(*b, torch.float64)
            return torch.stack([DY[g * tokens:(g + 1) * tokens].t() @ X[g * tokens:(g + 1) * tokens]
                                for g in range(G)])

        def peer_args():
            return _deq_cols(*a, BF).t(), _deq_cols(*b, BF)
        shape = (G, N, K)
    return dict(run=run, predq=lambda out: pq.INTO[kind](*args, out), shape=shape, flops=flops, ref=ref, peer_args=peer_args, ends32=ends32,
                M=M, N=N, K=K, G=G)


def gemms(s):
    G, T, H, F = s["G"], s["tokens"], s["H"], s["F"]
    return [("fc1_fwd", "fwd", 2 * F, H), ("fc2_fwd", "fwd", H, F),
            ("fc2_dgrad", "dgrad", H, F), ("fc1_dgrad", "dgrad", 2 * F, H),
            ("fc2_wgrad", "wgrad", H, F), ("fc1_wgrad", "wgrad", 2 * F, H)], G, T


# ------------------------------------------------------------------ phases


def phase_env():
    env = device_env()
    # dense bf16 matmul TFLOP/s on this device (a ceiling for the grouped bf16 GEMMs)
    a = torch.randn(8192, 8192, device="cuda", dtype=BF)
    ms = bench(lambda: a @ a, 200)
    env["dense_bf16_8192_tflops"] = 2 * 8192 ** 3 / ms / 1e9
    a = None
    RESULTS["env"] = env
    print(json.dumps(env, indent=1), flush=True)


def record(set_name, name, kind, G, T, N, K, do_check, sweep, rep, predq=True):
    rec = {"set": set_name, "gemm": name, "variant": kind, "G": G, "tokens_per_group": T,
           "M": G * T, "N": N, "K": K}
    print(f"\n== {set_name} {name}: {kind} G={G} M={G * T} N={N} K={K}", flush=True)
    try:
        p = problem(kind, G, T, N, K)
    except Exception:
        log_err(f"{set_name} {name} setup")
        return
    rec["flops"] = p["flops"]
    cfg = gg.GemmCfg.heuristic(kind, G, N, K, BF)
    rec["cfg"] = dataclasses.asdict(cfg)
    out = torch.full(p["shape"], float("nan"), dtype=BF, device="cuda")
    try:
        t0 = time.perf_counter()
        p["run"](out)
        torch.cuda.synchronize()
        rec["first_call_s"] = time.perf_counter() - t0        # compile + load + run
        if do_check:
            ref = p["ref"]()
            err = rel_err(out, ref)
            rec["rel_err"] = err
            check(f"{set_name} {name}", err <= 1e-2, f"rel err {err:.3e}")
            if predq:
                o2 = torch.full(p["shape"], float("nan"), dtype=BF, device="cuda")
                p["predq"](o2)
                e2 = rel_err(o2, ref)
                rec["predq_rel_err"] = e2
                check(f"{set_name} {name} predq", e2 <= 1e-2, f"rel err {e2:.3e}")
                o2 = None
            ref = None
        ms = bench(lambda: p["run"](out), rep)
        rec.update(cute_ms=ms, cute_tflops=p["flops"] / ms / 1e9)
        n = 100
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            p["run"](out)
        rec["host_us_per_call"] = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        print(f"   cute   {ms:8.3f} ms  {rec['cute_tflops']:7.1f} TFLOP/s  (host {rec['host_us_per_call']:.1f} us/call)",
              flush=True)
    except Exception:
        log_err(f"{set_name} {name} cute")
    if predq:
        try:
            ms = bench(lambda: p["predq"](out), rep)
            rec.update(predq_ms=ms, predq_tflops=p["flops"] / ms / 1e9)
            print(f"   predq  {ms:8.3f} ms  {rec['predq_tflops']:7.1f} TFLOP/s", flush=True)
        except Exception:
            log_err(f"{set_name} {name} predq")
    try:
        A, B = p["peer_args"]()
        ends = p["ends32"]
        torch._grouped_mm(A, B, offs=ends)
        ms = bench(lambda: torch._grouped_mm(A, B, offs=ends), rep)
        rec.update(torch_bf16_ms=ms, torch_bf16_tflops=p["flops"] / ms / 1e9)
        print(f"   torch._grouped_mm bf16 {ms:8.3f} ms  {rec['torch_bf16_tflops']:7.1f} TFLOP/s", flush=True)
        A = B = None
    except Exception:
        log_err(f"{set_name} {name} torch._grouped_mm")
    RESULTS["records"].append(rec)
    if sweep:
        for kw in sweep:
            srec = {"set": set_name, "gemm": name, "cfg": kw}
            try:
                kw = dict(kw)
                if kw.get("persistent"):
                    kw["sms"] = RESULTS["env"]["sms"] * kw.get("ctas_per_sm", 1)
                if kw.get("kernel") == "dq" and len(kw) == 1:
                    kw.update(persistent=False, epi_smem=kind == "wgrad", bufs=3)   # the old default
                c = gg.GemmCfg.heuristic(kind, G, N, K, BF, **kw)
                if c == cfg:
                    continue
                o2 = torch.full(p["shape"], float("nan"), dtype=BF, device="cuda")
                p["run"](o2, c)
                torch.cuda.synchronize()
                same = torch.equal(o2.view(torch.int16), out.view(torch.int16))
                srec["same_as_default"] = bool(same)
                if not same:
                    srec["rel_diff_vs_default"] = rel_err(o2, out.double())
                ms = bench(lambda: p["run"](o2, c), rep)
                srec.update(ms=ms, tflops=p["flops"] / ms / 1e9)
                print(f"   sweep {kw}: {ms:8.3f} ms {srec['tflops']:7.1f} TFLOP/s same={same}", flush=True)
            except Exception:
                log_err(f"{set_name} {name} sweep {kw}")
            RESULTS["sweeps"].append(srec)
    p = None
    torch.cuda.empty_cache()


def record_bf16(set_name, name, kind, G, T, N, K, rep, dq_fp32: bool, bf16_out: bool = False):
    """The bf16-operand TMA kernel (fp32 out) vs torch._grouped_mm (bf16 out) on the same
    dequantized operands, and optionally the mainloop-dequant kernel with fp32 out and
    (``bf16_out``) the TMA kernel with bf16 out beside torch._grouped_mm + the copy into a
    given ``out`` (what gemm_predq pays for a bf16 output)."""
    from tilekernels.moe import cute_gemm_bf16 as kb

    rec = {"set": set_name, "gemm": name, "variant": kind, "G": G, "M": G * T, "N": N, "K": K}
    print(f"\n== bf16 kernel {set_name} {name}: {kind} G={G} M={G * T} N={N} K={K}", flush=True)
    try:
        p = problem(kind, G, T, N, K)
        A, B = p["peer_args"]()
        Bk = B.transpose(-2, -1) if kind == "fwd" else B        # [G, N, K] contiguous
        assert Bk.is_contiguous()
        off = torch.cat([p["ends32"].new_zeros(1), p["ends32"]]).to(torch.int64)
        into = kb.gemm_fwd_into if kind == "fwd" else kb.gemm_dgrad_into
        rec["cfg"] = dataclasses.asdict(kb.Bf16GemmCfg.heuristic(kind, G, N, K, RESULTS["env"]["sms"]))
        out = torch.full(p["shape"], float("nan"), dtype=F32, device="cuda")
        t0 = time.perf_counter()
        into(A, Bk, off, out)
        torch.cuda.synchronize()
        rec["first_call_s"] = time.perf_counter() - t0
        ref = p["ref"]()
        err = rel_err(out, ref)
        rec["rel_err_fp32"] = err
        check(f"bf16 kernel {set_name} {name} fp32 out", err <= 1e-5, f"rel err {err:.3e}")
        ref = None
        ms = bench(lambda: into(A, Bk, off, out), rep)
        rec.update(bf16k_fp32_ms=ms, bf16k_fp32_tflops=p["flops"] / ms / 1e9)
        print(f"   bf16 kernel fp32 out {ms:8.3f} ms  {rec['bf16k_fp32_tflops']:7.1f} TFLOP/s", flush=True)
        ends = p["ends32"]
        ms = bench(lambda: torch._grouped_mm(A, B, offs=ends), rep)
        rec.update(torch_bf16_ms=ms, torch_bf16_tflops=p["flops"] / ms / 1e9)
        print(f"   torch._grouped_mm bf16 out {ms:8.3f} ms  {rec['torch_bf16_tflops']:7.1f} TFLOP/s", flush=True)
        if bf16_out:
            ob = torch.full(p["shape"], float("nan"), dtype=BF, device="cuda")
            into(A, Bk, off, ob)
            torch.cuda.synchronize()
            e = rel_err(ob, out.double())
            rec["rel_err_bf16_vs_fp32"] = e
            check(f"bf16 kernel {set_name} {name} bf16 out", e <= 1e-2, f"rel err {e:.3e}")
            ms = bench(lambda: into(A, Bk, off, ob), rep)
            rec.update(bf16k_bf16_ms=ms, bf16k_bf16_tflops=p["flops"] / ms / 1e9)
            ms = bench(lambda: ob.copy_(torch._grouped_mm(A, B, offs=ends)), rep)
            rec.update(torch_bf16_copy_ms=ms, torch_bf16_copy_tflops=p["flops"] / ms / 1e9)
            print(f"   bf16 kernel bf16 out {rec['bf16k_bf16_ms']:8.3f} ms  {rec['bf16k_bf16_tflops']:7.1f} TFLOP/s"
                  f" | torch._grouped_mm + copy {ms:8.3f} ms  {rec['torch_bf16_copy_tflops']:7.1f}", flush=True)
            ob = None
        if dq_fp32:
            o2 = torch.full(p["shape"], float("nan"), dtype=F32, device="cuda")
            p["run"](o2)
            torch.cuda.synchronize()
            rec["dq_vs_bf16k_rel"] = rel_err(o2, out.double())
            ms = bench(lambda: p["run"](o2), rep)
            rec.update(dq_fp32_ms=ms, dq_fp32_tflops=p["flops"] / ms / 1e9)
            print(f"   dq kernel fp32 out {ms:8.3f} ms  {rec['dq_fp32_tflops']:7.1f} TFLOP/s", flush=True)
            o2 = None
    except Exception:
        log_err(f"bf16 kernel {set_name} {name}")
    RESULTS["bf16"].append(rec)
    p = A = B = Bk = out = None
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sets", default="headline,g32")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-predq", action="store_true", help="skip the dequantize + torch._grouped_mm path")
    ap.add_argument("--full-sweep", action="store_true", help="also raster bands, 4 buffers, tile 128 x 1 CTA")
    ap.add_argument("--sweep-set", default="dq", choices=["dq", "ws"],
                    help="dq: the two-warpgroup kernel's configs; ws: the warp-specialized kernel's")
    ap.add_argument("--rep", type=int, default=200, help="do_bench rep (ms)")
    ap.add_argument("--bf16-kernel", action="store_true", help="also the bf16-operand TMA kernel (fwd / dgrad)")
    ap.add_argument("--only-bf16", action="store_true", help="only the --bf16-kernel records")
    ap.add_argument("--bf16-out", action="store_true",
                    help="--bf16-kernel: also bf16 out, beside torch._grouped_mm + copy")
    ap.add_argument("--dq-fp32", default="", help="set:gemm,... also timed on the dq kernel with fp32 out")
    ap.add_argument("--precompile", action="store_true",
                    help="compile every config of every GEMM first (no GPU work), then time")
    ap.add_argument("--wait-for", default="", help="after compiling, wait (<= 150 s) until this file exists")
    args = ap.parse_args()

    def sweep_of(kind):
        sweep = [] if args.no_sweep else SWEEP + (SWEEP_MORE if args.full_sweep else [])
        return SWEEP_WS if (args.sweep_set == "ws" and not args.no_sweep) else sweep

    if args.precompile:
        t0 = time.perf_counter()
        n = 0
        for set_name in args.sets.split(","):
            lst, G, T = gemms(SETS[set_name])
            for name, kind, N, K in lst:
                if (args.bf16_kernel or args.only_bf16) and kind != "wgrad":
                    from tilekernels.moe import cute_gemm_bf16 as kb

                    sms = torch.cuda.get_device_properties(0).multi_processor_count
                    for dt in (F32, BF) if args.bf16_out else (F32,):
                        kb.gemm_launch(kind, G, N, K, dt, torch.int64, None, sms).compile("sm_90a")
                        n += 1
                    if f"{set_name}:{name}" in args.dq_fp32.split(","):
                        gg.gemm_launch(kind, G, N, K, F32, torch.int64).compile("sm_90a")
                        n += 1
                if args.only_bf16:
                    continue
                for kw in [{}] + sweep_of(kind):
                    kw = dict(kw)
                    if kw.get("persistent"):
                        kw["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
                    if kw.get("kernel") == "dq" and len(kw) == 1:
                        continue
                    try:
                        cfg = gg.GemmCfg.heuristic(kind, G, N, K, BF, **kw)
                        gg.gemm_launch(kind, G, N, K, BF, torch.int64, cfg).compile("sm_90a")
                        n += 1
                    except Exception:
                        log_err(f"precompile {set_name} {name} {kw}")
        print(f"precompiled {n} kernels in {time.perf_counter() - t0:.1f} s", flush=True)
    if args.wait_for:
        t0 = time.perf_counter()
        while not os.path.exists(args.wait_for) and time.perf_counter() - t0 < 150:
            time.sleep(0.5)
        print(f"waited {time.perf_counter() - t0:.1f} s for {args.wait_for}", flush=True)
    phase_env()
    for set_name in args.sets.split(","):
        lst, G, T = gemms(SETS[set_name])
        for name, kind, N, K in lst:
            if (args.bf16_kernel or args.only_bf16) and kind != "wgrad":
                record_bf16(set_name, name, kind, G, T, N, K, args.rep,
                            f"{set_name}:{name}" in args.dq_fp32.split(","), args.bf16_out)
            if args.only_bf16:
                continue
            sweep = sweep_of(kind)
            record(set_name, name, kind, G, T, N, K, not args.no_check, sweep, args.rep, not args.no_predq)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "moe_gemm_check.json")
    with open(path, "w") as f:
        json.dump(RESULTS, f, indent=1)
    print(f"\nwrote {path}")
    print("\nsummary (ms / TFLOP/s): set gemm | cute dq | predq | torch bf16 | rel_err dq predq")
    for r in RESULTS["records"]:
        g = lambda k: r.get(k, float("nan"))  # noqa: E731
        print(f"  {r['set']:9s} {r['gemm']:10s} {g('cute_ms'):7.3f} {g('cute_tflops'):6.1f} | "
              f"{g('predq_ms'):7.3f} {g('predq_tflops'):6.1f} | {g('torch_bf16_ms'):7.3f} "
              f"{g('torch_bf16_tflops'):6.1f} | {g('rel_err'):.2e} {g('predq_rel_err'):.2e}")
    if RESULTS["bf16"]:
        print("\nbf16-operand kernel (ms / TFLOP/s): set gemm | bf16 kernel fp32 out | torch bf16 out | dq fp32 out | err")
        for r in RESULTS["bf16"]:
            g = lambda k: r.get(k, float("nan"))  # noqa: E731
            print(f"  {r['set']:9s} {r['gemm']:10s} {g('bf16k_fp32_ms'):7.3f} {g('bf16k_fp32_tflops'):6.1f} | "
                  f"{g('torch_bf16_ms'):7.3f} {g('torch_bf16_tflops'):6.1f} | {g('dq_fp32_ms'):7.3f} "
                  f"{g('dq_fp32_tflops'):6.1f} | {g('rel_err_fp32'):.2e}")
            if "bf16k_bf16_ms" in r:
                print(f"  {'':9s} {'bf16 out':10s} {g('bf16k_bf16_ms'):7.3f} {g('bf16k_bf16_tflops'):6.1f} | "
                      f"torch + copy {g('torch_bf16_copy_ms'):7.3f} {g('torch_bf16_copy_tflops'):6.1f}")
    if RESULTS["sweeps"]:
        print("\nsweep (TFLOP/s, same = bitwise equal to the default config's output):")
        for r in RESULTS["sweeps"]:
            if "tflops" in r:
                kw = ",".join(f"{k}={v}" for k, v in r["cfg"].items() if k != "sms")
                print(f"  {r['set']:9s} {r['gemm']:10s} {r['tflops']:7.1f}  same={r.get('same_as_default')}  {kw}")
    bad = [c for c in RESULTS["checks"] if not c["ok"]]
    if bad or RESULTS["errors"]:
        print(f"{len(bad)} failed checks, {len(RESULTS['errors'])} errors")
        sys.exit(1)


if __name__ == "__main__":
    main()
