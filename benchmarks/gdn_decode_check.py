#!/usr/bin/env python3
"""GPU timing of the gdn_decode kernels (cuTile, CuTe DSL) under CUDA-graph replay (device host).

From the repository root, on the GPU host (triton and fla are imported lazily: they exist
only there; fla-core 0.6.0 goes on PYTHONPATH from its carried wheel, outside the project's
dependencies):

    python3 benchmarks/gdn_decode_check.py --out "$OUT"            # B in {1, 32, 256}, fp32 + bf16 state
    python3 benchmarks/gdn_decode_check.py --out "$OUT" --sweep    # + dv-tile/occupancy variants
    python3 benchmarks/gdn_decode_check.py --out "$OUT" --backends cute,fla --cute-sweep
        # the CuTe DSL kernel (tilekernels/gdn/cute_decode.py, row "cute") and FLA only (the
        #   cute bundle has no cuTile), + its BV variants (CUTE_VARIANTS)
    python3 benchmarks/gdn_decode_check.py --out "$OUT" --variants --warm 8
        # + the named config variants (VARIANTS), their compiles first in 8 processes
        #   (cuTile's disk cache keeps them for the timing loop)
    python3 benchmarks/gdn_decode_check.py --out "$OUT" --backends cute --copy-floor
        # + row ``copy=``: a device copy of as many bytes as each step moves (the floor at that size)
    python3 benchmarks/gdn_decode_check.py --out "$OUT" --backends cute --ring --ring-variants s4,cps2 \
            --ring-cfg STAGES=5,CONSUMERS=256
        # + row ``cute-ring``: the TMA-ring kernel (tilekernels/gdn/cute_decode_ring.py, what the cute
        #   backend runs with cute_decode.RING on) at its heuristic config, rows ``ring-<name>`` its
        #   named VARIANTS and ``ring-<KEY=V,..>`` any DecodeRingCfg changes (no code edits)

Qwen3-Next shapes (Hk=16, Hv=32, dk=dv=128, W=4), bf16 mixed / conv_state / o, state_indices
a random permutation of N = B slots. Each case: one eager call checked against the torch
reference (o bf16, state at its dtype's tolerance), then triton's do_bench_cudagraph median
of the cuTile launch and of the torch reference path (``reference.decode`` + copy into o,
graph-replayed too). Rows: ``default`` (the registry's kernel and heuristic config),
with ``--variants`` the named configs of VARIANTS (each at its batches, its own split or the
default's), and ``fla`` (FLA's fused_recurrent_gated_delta_rule on the already-prepared q, k, v, g, beta with
its in-kernel l2norm, fp32 initial and final state: no conv step, so it moves less), and ``cute``
(the CuTe DSL backend at its heuristic config; ``cute-BV64`` etc. its CUTE_VARIANTS).
Bytes are counted by hand for our kernel: q|k|v|b|a of mixed read, conv_state rows read and
written, ssm_state rows read and written, o written, weights and indices read once (FLA's
row uses the same count: same state traffic, a little less of the rest).
%-of-copy is against 4.27 TB/s (H200 device-to-device copy) and against a copy measured here
the same way. Issue 12's targets (fp32 state): B=1 <= 5 us, B=32 <= 35 us, B=256 <= 280 us.
benchmarks/probes/gdn_decode_session.sh runs this with the GPU tests, sanitizers and an ncu
profile in one device call.
Prints a table; writes gdn_decode_check.json to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _gpu import log_error  # noqa: E402

from tilekernels.gdn import bench as mk  # noqa: E402
try:  # the cute bundle has no cuTile: its rows (default, --variants, --sweep) need it, --backends cute does not
    from tilekernels.gdn import cutile_decode as cd  # noqa: E402
except ImportError:
    cd = None
from tilekernels.gdn import reference as ref  # noqa: E402
from tilekernels.testing import rel_err, tolerance  # noqa: E402

SHAPE = dict(Hk=16, Hv=32, dk=128, dv=128, W=4)
COPY_TBS = 4.27
TARGET_US = {1: 5.0, 32: 35.0, 256: 280.0}
RESULTS: dict = {"records": [], "sweeps": [], "errors": [], "env": {}}


def bench_graph(fn, rep=200) -> float:
    """Median us of fn under CUDA-graph replay (triton.testing.do_bench_cudagraph)."""
    from triton.testing import do_bench_cudagraph

    fn()
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3


def decode_bytes(B, Hk, Hv, dk, dv, W, elt=2, selt=4) -> int:
    C = 2 * Hk * dk + Hv * dv
    per_row = elt * (C + 2 * Hv) + 2 * elt * C * (W - 1) + 2 * selt * Hv * dk * dv + elt * Hv * dv + 4
    return B * per_row + elt * C * W + 2 * 4 * Hv


def problem(B, state_dtype, N=None):
    N = N or B
    h = (SHAPE["Hk"], SHAPE["Hv"], SHAPE["dk"], SHAPE["dv"])
    w, A, dt = mk.weights(*h, SHAPE["W"], device="cuda")
    conv, ssm = mk.decode_states(N, *h, SHAPE["W"], state_dtype=state_dtype, device="cuda")
    x = mk.mixed((B,), *h, device="cuda")
    idx = torch.randperm(N, device="cuda")[:B].to(torch.int32)
    o = torch.empty(B, SHAPE["Hv"], SHAPE["dv"], dtype=torch.bfloat16, device="cuda")
    return x, conv, w, A, dt, ssm, idx, o


def check(args, launch):
    """One eager launch vs the torch reference on copies (fp32 math). Returns rel errors."""
    x, conv, w, A, dt, ssm, idx, o = args
    c2, s2 = conv.clone(), ssm.clone()
    want = ref.decode(x, c2, w, A, dt, s2, idx, Hk=SHAPE["Hk"])
    launch.run()
    torch.cuda.synchronize()
    errs = {"o": rel_err(o, want), "ssm_state": rel_err(ssm, s2), "conv_state_equal": bool(torch.equal(conv, c2))}
    ok = errs["o"] <= tolerance(o.dtype) and errs["ssm_state"] <= tolerance(ssm.dtype) and errs["conv_state_equal"]
    return errs, ok


def copy_tbs(sm_kernel: bool = False) -> float:
    """Device-to-device copy bandwidth (read + write bytes), graph-replayed, 1 GiB: ``copy_`` (captured: a
    graph memcpy node) or, with ``sm_kernel``, an SM kernel (torch.neg) over the same bytes."""
    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    us = bench_graph((lambda: torch.neg(a, out=b)) if sm_kernel else (lambda: b.copy_(a)))
    return 2 * a.numel() * 4 / (us * 1e-6) / 1e12


def _cute_mod():
    """tilekernels.gdn.cute_decode, imported on first use (needs the cute bundle's cutlass)."""
    from tilekernels.gdn import cute_decode
    return cute_decode


def _ring_mod():
    """tilekernels.gdn.cute_decode_ring (the TMA-ring kernel), imported on first use."""
    from tilekernels.gdn import cute_decode_ring
    return cute_decode_ring


# the CuTe DSL kernel's configs beside its heuristic (--cute-sweep): changes to its DecodeCfg, from
# that config (H200, session 8, us at B = 1 / 32 / 256, fp32 state; benchmarks/results/h200-gdn-decode-cute.txt):
# first kernel (96 registers): heuristic 3.69 / 49.77 / 363.40, BV64 3.57 / 52.52 / 380.67, BV128
# 5.44 / 61.67 / 468.76, KS2 4.17 / 55.08 / 390.03; the 72-register kernel (VEC 1): heuristic 3.76 /
# 46.41 / 329.30, BV64 3.62 / 47.55 / 336.02, KS2 5.16 / 54.39 / 374.63, MINB8 4.07 / 47.50 / 335.04.
# Session 9 (H200, us at B = 1 / 32 / 256, fp32 | bf16 state; benchmarks/results/h200-gdn-decode-cute.txt),
# VEC columns a thread (one vector state access per row): v1 (the session-8 config) 3.79 / 46.49 /
# 329.17 | 3.55 / 26.10 / 237.26; v2 3.67 / 47.56 / 335.29 | 3.46 / 24.15 / 230.85; v4 (BV 32, KS 16,
# 32 values) 3.85 / 48.76 / 356.54 | 3.54 / 26.20 / 245.83; v4-b64k8 (the new heuristic) 3.68 /
# 45.14 / 309.43 | 3.36 / 21.73 / 216.46; v4-b32k8 (64 threads) 4.08 / 49.43 / 331.50 | 3.82 /
# 24.67 / 239.50; v4-b64k4 (128 values, fp32) 4.40 / 51.67 / 348.60; v4 + STREAM 3.84 / 47.72 /
# 367.30 | 3.55 / 27.62 / 244.75 (run 2). Run 3, at the new heuristic (cute 3.72 / 44.93 / 307.87 |
# 3.55 / 21.53 / 218.20): v4-b64k8-stream 3.74 / 42.62 / 316.88 | 3.35 / 23.17 / 212.86; v4-b64k8-minb5
# 4.09 / 44.25 / 299.60 | 3.65 / 20.90 / 211.44; v4-b128k4 4.74 / 46.76 / 319.68 | 3.95 / 21.19 / 216.53.
# Session 9, round 2: SHARE (the cluster's CTAs split the q|k prologue, distributed smem) is the
# heuristic's, with MINB 5 where the grid is large (the "cute" row at B >= 16); "share" its small-grid
# config at every B, "v4-b64k8" the session-9 default (no SHARE, no MINB). H200, one run, us at B = 1 /
# 32 / 256 fp32 | bf16: cute 3.70 / 43.79 / 302.11 | 3.24 / 20.75 / 212.97; share 3.72 / 46.28 / 327.73 |
# 3.23 / 20.38 / 211.24; v4-b64k8 3.68 / 44.83 / 308.29 | 3.45 / 21.59 / 216.49; v4-b64k8-minb5 4.10 /
# 44.43 / 300.07 | 3.68 / 20.97 / 210.44; share-stream 3.70 / 44.08 / 331.58 | 3.23 / 21.85 / 207.16.
CUTE_VARIANTS = {  # name: (state dtypes, VEC, BV, KS, STREAM, MINB, SHARE); "v1" is the session-8 kernel
    "v1": ("fp32,bf16", 1, 32, 4, False, 0, False), "v4-b64k8": ("fp32,bf16", 4, 64, 8, False, 0, False),
    "v4-b64k8-minb5": ("fp32,bf16", 4, 64, 8, False, 5, False),
    "share": ("fp32,bf16", 4, 64, 8, False, 0, True), "share-stream": ("fp32,bf16", 4, 64, 8, True, 0, True),
    "share-minb5": ("fp32,bf16", 4, 64, 8, False, 5, True), "share-stream-minb5": ("fp32,bf16", 4, 64, 8, True, 5, True),
    # bf16 state in 16-byte vectors (VEC 8: 64 values a thread in 8 loads, 128 registers): session 13, H200, each 4-17%
    # slower than the default at B = 1 .. 256 (benchmarks/results/h200-gdn-decode-cute.txt, call 9)
    "v8-b64k16": ("bf16", 8, 64, 16, False, 0, True), "v8-b64k16-stream": ("bf16", 8, 64, 16, True, 0, True),
    "v8-b64k16-minb5": ("bf16", 8, 64, 16, False, 5, True), "v8-b128k16": ("bf16", 8, 128, 16, False, 0, True),
    "v8-b128k16-stream": ("bf16", 8, 128, 16, True, 0, True),
    # session 14: ptxas held to 4 / 6 CTAs an SM (the grid's last wave: 2048 CTAs are 3.1 waves of 660 at MINB 5,
    # 3.9 of 528 at MINB 4), and 32 values a thread (KS 16, 256 threads) at 4 CTAs an SM: all slower than the
    # default at every B = 16 .. 256, fp32 (B=32: 43.6 / 46.3 / 45.4 us against 41.8; h200-gdn-decode-cute.txt)
    "share-stream-minb4": ("fp32,bf16", 4, 64, 8, True, 4, True), "share-stream-minb6": ("fp32,bf16", 4, 64, 8, True, 6, True),
    "share-minb4": ("fp32,bf16", 4, 64, 8, False, 4, True),
    "k16-stream-minb4": ("fp32,bf16", 4, 64, 16, True, 4, True),
}


def cute_variant(name, base):
    """CUTE_VARIANTS[name]'s VEC, BV, KS, STREAM, MINB, SHARE in the heuristic's config ``base``."""
    _, VEC, BV, KS, st, minb, sh = CUTE_VARIANTS[name]
    return dataclasses.replace(base, VEC=VEC, BV=BV, KS=KS, STREAM=st, MINB=minb, SHARE=sh)


def _rec(tag, B, sd, us, cfg=None, **extra):
    nbytes = decode_bytes(B, **SHAPE, selt=torch.finfo(sd).bits // 8)
    rec = dict(tag=tag, B=B, state=str(sd).removeprefix("torch."), us=us, bytes=nbytes,
               tbs=nbytes / (us * 1e-6) / 1e12, cfg=dataclasses.asdict(cfg) if cfg else None, **extra)
    rec["pct_copy_4.27"] = 100 * rec["tbs"] / COPY_TBS
    if sd == torch.float32 and tag in ("default", "cute", "cute-ring"):
        rec["target_us"] = TARGET_US.get(B)
    return rec


def run_case(B, sd, cfg=None, with_ref=True, tag="default", split=None, rep=200, mod=None):
    """One row: ``mod``'s launch at batch B, state dtype sd, config cfg (None: mod's
    heuristic) and split (None: default)."""
    mod = mod or cd
    args = problem(B, sd)
    x, conv, w, A, dt, ssm, idx, o = args
    kw = {} if split is None else {"split": split}
    ln = mod.decode_launch(x, conv, w, A, dt, ssm, idx, o, SHAPE["Hk"], 1e-6, None, cfg=cfg, **kw)
    errs, ok = check(args, ln)
    rec = _rec(tag, B, sd, bench_graph(ln.run, rep=rep), ln.cfg, errs=errs, ok=ok, grid=ln.grid)
    if with_ref:
        def torch_path():
            o.copy_(ref.decode(x, conv, w, A, dt, ssm, idx, Hk=SHAPE["Hk"]))
        rec["torch_ref_us"] = bench_graph(torch_path, rep=50)
    return rec


def copy_case(B, sd, rep=200):
    """The copy floor at this size (``--copy-floor``): an SM kernel (torch.neg: 16-byte loads and stores)
    over half this step's bytes (decode_bytes: so it reads and writes as many bytes as the step),
    graph-replayed by the same timer (``copy_`` is not used: captured, a device-to-device copy is a
    graph memcpy node, which ran at 2.7 TB/s on the H200 against 4.2+ for SM kernels).
    What a kernel that only moved the step's bytes, with no dependent loads, would take: at B = 32 the
    step is ~134 MB, where launch, ramp-up and the last wave weigh on the copy kernel too."""
    n = decode_bytes(B, **SHAPE, selt=torch.finfo(sd).bits // 8) // 2 // 16 * 4
    a = torch.randn(n, device="cuda")
    b = torch.empty_like(a)
    us = bench_graph(lambda: torch.neg(a, out=b), rep=rep)
    return _rec("copy=", B, sd, us, ok=bool(torch.equal(-a, b)))


def fla_case(B, rep=200):
    """FLA's fused_recurrent_gated_delta_rule, one token per row, fp32 state [B, Hv, dk, dv]:
    q, k post-conv (l2norm in its kernel), v, g, beta precomputed; its final state written to
    its own buffer (same bytes as in place). Checked against the float64 recurrence."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    Hk, Hv, dk, dv = SHAPE["Hk"], SHAPE["Hv"], SHAPE["dk"], SHAPE["dv"]
    dev = "cuda"
    q = torch.randn(B, 1, Hk, dk, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, 1, Hk, dk, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, 1, Hv, dv, device=dev, dtype=torch.bfloat16)
    g = F.logsigmoid(torch.randn(B, 1, Hv, device=dev))
    beta = torch.rand(B, 1, Hv, device=dev)
    h0 = torch.randn(B, Hv, dk, dv, device=dev) * 0.1

    def step():
        return fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, scale=dk ** -0.5, initial_state=h0,
                                                output_final_state=True, use_qk_l2norm_in_kernel=True)

    with torch.no_grad():
        o, hT = step()
        qn = F.normalize(q.double(), dim=-1).repeat_interleave(Hv // Hk, 2)[:, 0]
        kn = F.normalize(k.double(), dim=-1).repeat_interleave(Hv // Hk, 2)[:, 0]
        S = h0.double() * g.double()[:, 0].exp()[..., None, None]
        u = beta.double()[:, 0, :, None] * (v.double()[:, 0] - torch.einsum("bhkv,bhk->bhv", S, kn))
        S = S + kn[..., None] * u[:, :, None, :]
        o_ref = torch.einsum("bhkv,bhk->bhv", S, dk ** -0.5 * qn)
        errs = {"o": rel_err(o[:, 0], o_ref), "ssm_state": rel_err(hT, S)}
        us = bench_graph(step, rep=rep)
    return _rec("fla", B, torch.float32, us, errs=errs, ok=errs["o"] <= tolerance(torch.bfloat16))


def sweep_cases(sd, batches):
    """(cfg, B, split) variants beside the default: dv tile x occupancy x blocks per key head."""
    base = cd.DecodeCfg.heuristic(SHAPE["Hk"], SHAPE["Hv"], SHAPE["dk"], SHAPE["dv"], SHAPE["W"],
                                  torch.finfo(sd).bits // 8)
    dv = SHAPE["dv"]
    grid = [(32, 2), (32, 3), (64, 2), (64, 3), (128, 2)] if sd == torch.float32 else [(32, 2), (64, 2), (128, 2)]
    out = []
    for B in sorted(batches, reverse=True):
        for BV, OCC in grid:
            cfg = base.with_tile(dv, BV, OCC=OCC)
            G = cfg.R * cfg.NV
            splits = {1: (G, G // 2), 32: (1, 2, 4)}.get(B, (1, 2))
            out += [(cfg, B, ns) for ns in splits if ns >= 1 and G % ns == 0]
    return out


# named config variants beside the default (--variants): state dtype, changes to the default
# config (BV re-tiles), the batches, and an explicit split (None: the default's). OCC: occupancy
# hint; PF1: PF at split 1 (off by default: PF computed wrong results at other settings); STATIC:
# gdn_decode_whole at split 1; TMA False: plain state loads/stores; FUSE: the q|k prologue as one
# conv step with one stacked dk-reduction (q.q, k.k, q.k); EARLY: the (b, kh) counter taken right
# after the window reads; STMA False: state stores from registers (TMA loads). "dflt" is the
# default (gdn_decode_variants.sh runs its tests; no extra rows). Measured in session 6 (H200, us
# at B = 1 / 32 / 64 / 256, default 9.4 / 68.3 / 113.3 / 408.6): PF1 9.4 / 61.0 / 103.7 / 386.4;
# STATIC - / 59.7 / 115.1 / 423.3; OCC4 8.4 / 58.9 / - / 419.4; BV16 9.4-9.8 / 86-114 / - / 628-667;
# BV8 OCC4 12.0 / - / - / 948; plain loads BV32 OCC2 9.5 / 83.5 / - / 627; LAT10 - / - / - / 402;
# bf16: PF (fwd) - / 40.7 / - / 326.7, BV32 - / 42.7 / - / 340.7 (default 10.7 / 35.8 / 86.2 /
# 315.3). Session 7 (default 9.39 / 68.89 / - / 409.78, FLA 3.40 / 49.13 / - / 365.22): FUSE with
# S^T k and S^T q stacked too (dropped) 14.26 / 182.88 / - / 1057.08, + EARLY 14.46 / 180.63 / - /
# 992.30, + EARLY OCC4 10.62 / 114.10 / - / 854.55, + EARLY STMA False 14.43 / ... (timing cut).
# Wrong results, not timed again: PF at occupancy 4 (B=256), at BV 128 and with MM, plain loads
# at BV8 OCC2. benchmarks/probes/gdn_decode_variant_tests.py runs the GPU tests at a variant.
VARIANTS = {
    "dflt": ("fp32", {}, (), None),
    "f-Fq": ("fp32", dict(FUSE=True), (1, 32, 256), None),
    "f-E": ("fp32", dict(EARLY=True), (1, 32, 256), None),
    "f-st": ("fp32", dict(STMA=False), (32, 256), None),
    "f-o4": ("fp32", dict(OCC=4), (1, 32, 256), None),
    "f-Fqo4": ("fp32", dict(FUSE=True, OCC=4), (1, 32, 256), None),
    "b-Fq": ("bf16", dict(FUSE=True), (1, 256), None),
}
SDT = {"fp32": torch.float32, "bf16": torch.bfloat16}


def variant_cfg(sd, changes):
    cfg = cd.DecodeCfg.heuristic(SHAPE["Hk"], SHAPE["Hv"], SHAPE["dk"], SHAPE["dv"], SHAPE["W"],
                                 torch.finfo(sd).bits // 8)
    changes = dict(changes)
    if "BV" in changes:
        cfg = cfg.with_tile(SHAPE["dv"], changes.pop("BV"))
    return dataclasses.replace(cfg, **changes)


def _warm_one(job):
    """Compile one (module, state dtype, cfg) by launching it at B=2, at its default split and
    at split 1 (a child process: cuTile compiles under one lock per process; its disk cache
    keeps the cubins)."""
    mod_name, sd, changes = job
    try:
        mod = {"cd": cd}.get(mod_name) or __import__(mod_name)
        cfg = variant_cfg(SDT[sd], changes) if mod_name == "cd" else None
        x, conv, w, A, dt, ssm, idx, o = problem(2, SDT[sd])
        for split in (None, 1):  # both kernels where STATIC picks gdn_decode_whole at split 1
            mod.decode_launch(x, conv, w, A, dt, ssm, idx, o, SHAPE["Hk"], 1e-6, None, cfg=cfg, split=split).run()
        torch.cuda.synchronize()
        return None
    except Exception as e:  # reported by the timing loop, which compiles it again
        return f"{job}: {e!r}"[:300]


def warm(jobs, procs):
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(procs) as pool:
        for err in pool.imap_unordered(_warm_one, jobs):
            if err:
                print("warm:", err, flush=True)


def _row(rec):
    print(f"{rec['tag']:<12}{rec['B']:>5} {rec['state']:<9}{rec['us']:>9.2f}{rec['tbs']:>7.2f}"
          f"{rec['pct_copy_4.27']:>7.1f}{rec.get('torch_ref_us', float('nan')):>10.1f}"
          f"{str(rec.get('target_us') or ''):>8}  {rec['ok']}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sweep", action="store_true", help="also time dv-tile / occupancy variants")
    ap.add_argument("--no-peers", action="store_true", help="skip the FLA rows")
    ap.add_argument("--backends", default="cutile,cute,fla", help="rows to time: cutile, cute, fla")
    ap.add_argument("--cute-sweep", action="store_true", help="also time CUTE_VARIANTS")
    ap.add_argument("--cute-only", default="", help="with --cute-sweep: a comma list of CUTE_VARIANTS names to time")
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--variants", action="store_true", help="also time the named VARIANTS")
    ap.add_argument("--only", default="", help="with --variants: a comma list of VARIANTS names to time")
    ap.add_argument("--no-ref", action="store_true", help="skip the torch reference timings")
    ap.add_argument("--warm", type=int, default=0, help="compile the variants first in this many processes")
    ap.add_argument("--warm-only", action="store_true", help="only compile (with --warm), then exit")
    ap.add_argument("--rep", type=int, default=200, help="ms of graph replays per timing (x10 retries)")
    ap.add_argument("--copy-floor", action="store_true", help="also time a copy of each step's bytes (row copy=)")
    ap.add_argument("--ring", action="store_true", help="also time the TMA-ring kernel (row cute-ring)")
    ap.add_argument("--ring-variants", default="",
                    help="comma list of cute_decode_ring.VARIANTS names to time (rows ring-<name>), or 'all'")
    ap.add_argument("--ring-cfg", action="append", default=[],
                    help="a ring config as DecodeRingCfg changes, KEY=V,KEY=V (e.g. STAGES=4,BV=32); repeatable")
    a = ap.parse_args()
    if a.warm:
        jobs = [("cd", sd, {}) for sd in SDT]
        only = set(filter(None, a.only.split(",")))
        jobs += [("cd", sd, ch) for n, (sd, ch, _, _) in VARIANTS.items() if not only or n in only] if a.variants else []
        warm(jobs, a.warm)
        if a.warm_only:
            return 0
    RESULTS["env"] = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                          default_cfg={str(sd): dataclasses.asdict((cd or _cute_mod()).DecodeCfg.heuristic(
                                           16, 32, 128, 128, 4, n)) for sd, n in (("fp32", 4), ("bf16", 2))})
    if a.ring or a.ring_variants or a.ring_cfg:
        RESULTS["env"]["ring_cfg"] = {sd: dataclasses.asdict(_ring_mod().DecodeRingCfg.heuristic(16, 32, 128, 128, 4, n))
                                      for sd, n in (("fp32", 4), ("bf16", 2))}
        # the registry's ring takes 3 stages from this many items (ring_config): the cute-ring rows' config there
        RESULTS["env"]["ring_stages3_from_items"] = _ring_mod().STAGES3_FROM
    try:
        RESULTS["env"]["copy_tbs_measured"] = copy_tbs()
        RESULTS["env"]["copy_tbs_sm_kernel"] = copy_tbs(sm_kernel=True)
    except Exception:
        log_error(RESULTS["errors"], "copy", limit=4)
    print(json.dumps(RESULTS["env"]), flush=True)
    batches = [int(b) for b in a.batches.split(",")]
    lines = []

    def keep(rec, where="records"):
        RESULTS[where].append(rec)
        _row(rec)
        lines.append(rec)

    backends = set(a.backends.split(","))
    for sd in (torch.float32, torch.bfloat16):
        for B in batches:
            if "cutile" in backends:
                try:
                    keep(run_case(B, sd, with_ref=not a.no_ref, rep=a.rep))
                except Exception:
                    log_error(RESULTS["errors"], f"default B={B} {sd}", limit=6)
            if "cute" in backends:
                try:
                    keep(run_case(B, sd, with_ref=False, rep=a.rep, tag="cute", mod=_cute_mod()))
                except Exception:
                    log_error(RESULTS["errors"], f"cute B={B} {sd}", limit=6)
                for name, ch in CUTE_VARIANTS.items() if a.cute_sweep else ():
                    if a.cute_only and name not in a.cute_only.split(","):
                        continue
                    if str(sd).removeprefix("torch.").replace("bfloat16", "bf16").replace("float32", "fp32") \
                            not in ch[0].split(","):
                        continue
                    try:
                        cq = _cute_mod()
                        base = cq.DecodeCfg.heuristic(SHAPE["Hk"], SHAPE["Hv"], SHAPE["dk"], SHAPE["dv"], SHAPE["W"],
                                                      torch.finfo(sd).bits // 8)
                        keep(run_case(B, sd, cfg=cute_variant(name, base), with_ref=False, tag=name,
                                      rep=min(a.rep, 100), mod=cq), "sweeps")
                    except Exception:
                        log_error(RESULTS["errors"], f"{name} B={B} {sd}", limit=6)
            ring_rows = [("cute-ring", None)] if a.ring else []
            names = a.ring_variants.split(",") if a.ring_variants != "all" else list(_ring_mod().VARIANTS)
            ring_rows += [(f"ring-{n}", n) for n in names + a.ring_cfg if n]
            for tag, name in ring_rows:
                try:
                    rg = _ring_mod()
                    cfg = None if name is None else rg.variant_cfg(name, SHAPE["Hk"], SHAPE["Hv"], SHAPE["dk"],
                                                                    SHAPE["dv"], SHAPE["W"], torch.finfo(sd).bits // 8)
                    if name is None or cfg is not None:  # None: a variant for the other state dtype
                        keep(run_case(B, sd, cfg=cfg, with_ref=False, rep=a.rep if name is None else min(a.rep, 100),
                                      tag=tag, mod=rg), "records" if name is None else "sweeps")
                except Exception:
                    log_error(RESULTS["errors"], f"{tag} B={B} {sd}", limit=6)
            if a.copy_floor:
                try:
                    keep(copy_case(B, sd, rep=a.rep))
                except Exception:
                    log_error(RESULTS["errors"], f"copy B={B} {sd}", limit=6)
            if sd == torch.float32 and not a.no_peers and "fla" in backends:
                try:
                    keep(fla_case(B, rep=a.rep))
                except Exception:
                    log_error(RESULTS["errors"], f"fla B={B}", limit=6)
    only = set(filter(None, a.only.split(",")))
    for name, (sdn, changes, bs, ns) in VARIANTS.items() if a.variants else ():
        if only and name not in only:
            continue
        for B in bs:
            try:
                keep(run_case(B, SDT[sdn], cfg=variant_cfg(SDT[sdn], changes), with_ref=False, tag=name,
                              split=ns, rep=min(a.rep, 100)), "sweeps")
            except Exception:
                log_error(RESULTS["errors"], f"variant {name} B={B}", limit=6)
    if a.sweep:
        for sd, bs in ((torch.float32, batches), (torch.bfloat16, [max(batches)])):
            for cfg, B, ns in sweep_cases(sd, bs):
                tag = f"BV{cfg.BV}o{cfg.OCC}s{ns}"
                try:
                    keep(run_case(B, sd, cfg=cfg, with_ref=False, tag=tag, split=ns, rep=100), "sweeps")
                except Exception:
                    log_error(RESULTS["errors"], f"sweep {cfg} B={B} split={ns}", limit=6)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "gdn_decode_check.json")
    with open(path, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    print("wrote", path, flush=True)
    print(f"\n{'tag':<12}{'B':>5} {'state':<9}{'us':>9}{'TB/s':>7}{'%4.27':>7}{'torch us':>10}{'target':>8}  ok")
    for rec in sorted(lines, key=lambda r: (r["state"], r["B"], r["us"])):
        _row(rec)
    return 1 if RESULTS["errors"] or not all(r["ok"] for r in RESULTS["records"] + RESULTS["sweeps"]) else 0


if __name__ == "__main__":
    sys.exit(main())
