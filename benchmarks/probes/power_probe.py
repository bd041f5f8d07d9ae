#!/usr/bin/env python3
"""Probe: SM clock and board power while one workload runs back to back (H200: is a pass power-capped?).

Why: session 37 saw mhc_post_pre's rows slow down over a run while nvidia-smi reported 690-698 W against the 700 W
limit, the "SW power cap" clock reason and SM clocks of 1470-1850 MHz instead of 1980. A memory pattern that moves
the same bytes faster only pays where the SMs then keep their clock. This runs each workload for ``--secs`` seconds
(after one second of warm-up) while ``nvidia-smi -lms 100`` samples the board, and prints per workload the kernel
time (CUDA events over the window), mean power, mean and minimum SM clock and the share of samples with the power-cap
reason.

Workloads (``--rows``): ``copy`` (1.88 GB copy_), ``pbda_fwd`` / ``pbda_bwd`` (h_post_bda's CuTe DSL kernels; ``:H=1``
with fp32 h holding bf16 values),
``pr_fwd`` / ``pr_bwd`` (mhc_proj_rms's: the forward kernel, the backward with its reduction),
``skel`` / ``skel:LOCK=2`` (post_pre_bwd_skeleton.py's backward traffic, consumers idle), and post_pre_pass_ab.py's
rows (``bwd``, ``fwd``, ``dhdw``, with FIELD=V changes); ``decode:B=32`` (gdn_decode's TMA ring, fp32 state, 50 steps
a CUDA graph: the row's us are 50 steps') and ``decode_copy:B=32`` (an SM copy of a step's bytes, the same way);
``res:FIELD=V:..`` (mhc_post_pre's resident forward pass, cute_post_pre_res, its PostPreResCuteCfg fields).

    source .gpu-cute/env.sh && python3 benchmarks/probes/power_probe.py --rows copy,skel,bwd --out "$OUT"
"""
from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "benchmarks", "probes")]

import torch  # noqa: E402

from _gpu import log_error, probe_record  # noqa: E402


def _workload(spec):
    name, *kv = spec.split(":")
    changes = {k: int(v) for k, v in (x.split("=") for x in kv)}
    T, n, C = 32768, 4, 7168
    if name == "copy":
        a = torch.randn(T * n * C, device="cuda").to(torch.bfloat16)
        b = torch.empty_like(a)
        return lambda: b.copy_(a)
    if name in ("decode", "decode_copy"):   # gdn_decode's TMA ring at B (fp32 state) / a copy of its bytes, 50 a graph
        from gdn_decode_check import SHAPE, _ring_mod, decode_bytes, problem

        B = changes.get("B", 32)
        if name == "decode":
            x, conv, w, A, dt, ssm, idx, o = problem(B, torch.float32)
            ln = _ring_mod().decode_launch(x, conv, w, A, dt, ssm, idx, o, SHAPE["Hk"], 1e-6, None)
            step = ln.run
        else:
            a = torch.randn(decode_bytes(B, **SHAPE, selt=4) // 8, device="cuda")
            b = torch.empty_like(a)
            step = functools.partial(torch.neg, a, out=b)
        step()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(50):
                step()
        return g.replay
    if name in ("pr_fwd", "pr_bwd"):   # mhc_proj_rms's CuTe DSL kernels at M = T, K = n C, N = 24
        from tilekernels.mhc import cute_proj_rms as PR
        from tilekernels.mhc import cute_proj_rms_fwd as PF

        M, K, N = T, n * C, n * n + 2 * n
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        w = (torch.randn(N, K, device="cuda") * K ** -0.5).to(torch.bfloat16)
        proj, r = torch.empty(M, N, device="cuda"), torch.empty(M, device="cuda")
        if name == "pr_fwd":
            return lambda: PF.fwd_into(x, w, proj, r, 1e-6)
        PF.fwd_into(x, w, proj, r, 1e-6)
        dproj, dr = torch.randn(M, N, device="cuda"), torch.randn(M, device="cuda")
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        return lambda: PR.bwd_into(dproj, dr, x, w, r, dx, dw, 1e-6)
    if name in ("pbda_fwd", "pbda_bwd"):   # h_post_bda's CuTe DSL kernels (SIMT), fp32 h, bf16 bias
        from tilekernels.mhc import cute_post_bda as B

        bf, f32 = torch.bfloat16, torch.float32
        hr, hp = torch.rand(T, n, n, device="cuda"), torch.rand(T, n, device="cuda")
        if changes.get("H"):   # H=1: fp32 h holding bf16 values (low 16 mantissa bits zero; session 54)
            hr, hp = hr.to(bf).to(f32), hp.to(bf).to(f32)
        res, x, bias = (torch.randn(*s, device="cuda").to(bf) for s in ((T, n, C), (T, C), (C,)))
        if name == "pbda_fwd":
            out = torch.empty_like(res)
            return lambda: B.fwd_into(hr, res, hp, x, bias, out)
        dout = torch.randn(T, n, C, device="cuda").to(bf)
        outs = (torch.empty(T, n, n, dtype=f32, device="cuda"), torch.empty_like(res),
                torch.empty(T, n, dtype=f32, device="cuda"), torch.empty_like(x), torch.empty_like(bias))
        return lambda: B.bwd_into(dout, hr, res, hp, x, bias, *outs)
    if name == "skel":
        import post_pre_bwd_skeleton as S

        cfg = S.SkelCfg(**changes)
        bf = torch.bfloat16
        t = [torch.randn(*s, device="cuda").to(bf) for s in ((T, n, C), (T, n, C), (T, C), (T, C))]
        w = torch.randn(cfg.NPK, cfg.nch * 256, device="cuda").to(bf)
        o = [torch.empty(T, n, C, dtype=bf, device="cuda"), torch.empty(T, C, dtype=bf, device="cuda")]
        ln = S.launch(cfg)
        return lambda: ln.run(*t, w, *o, T)
    if name == "res":   # mhc_post_pre's resident forward pass (cute_post_pre_res), PostPreResCuteCfg fields as FIELD=V
        import dataclasses

        from post_pre_res_cut import _inputs

        from tilekernels.mhc import cute_post_pre_res as RS

        res, x, bias, w, hres, hpost, hb = _inputs(T, n, C)
        cfg = dataclasses.replace(RS.PostPreResCuteCfg.heuristic(n, C, w.shape[0], True), **changes)
        out, li = torch.empty_like(res), torch.empty_like(x)
        pp = torch.empty(cfg.CL, T, cfg.NPAD, device="cuda")
        ps = torch.empty(cfg.CL, T, device="cuda")
        ln, nct = RS.launch(cfg), RS.ctas(cfg, T, torch.device("cuda"))
        return lambda: ln.run(res, x, bias, w, hres, hpost, hb, out, li, pp, ps, T, nct, 1e-6, 1.0)
    import post_pre_pass_ab as P

    cfg = P._cfg(name, changes, n, C, n * n + 2 * n, 32)
    return P._runner(name, cfg, T, n, C, n * n + 2 * n, 32)


def parse_smi(lines) -> list[tuple[float, float, float, int]]:
    """(epoch seconds, SM MHz, watts, clock-reason bits) of each ``nvidia-smi --format=csv,noheader,nounits`` line
    (timestamp, clocks.sm, power.draw, clocks_throttle_reasons.active), lines that do not parse skipped."""
    out = []
    for r in csv.reader(lines):
        try:
            t = r[0].strip()
            ts = time.mktime(time.strptime(t[:19], "%Y/%m/%d %H:%M:%S")) + float("0" + t[19:])
            out.append((ts, float(r[1]), float(r[2]), int(r[3].strip(), 16)))
        except (ValueError, IndexError):
            continue
    return out


def summarize(windows: list[dict], samples) -> None:
    """Adds to each window (t0, t1: epoch seconds) its samples' count, mean watts, mean and minimum MHz and the share
    with the SW power-cap reason (bit 0x4), its first 0.2 s left out (the board's readings lag)."""
    for w in windows:
        s = [x for x in samples if w["t0"] + 0.2 <= x[0] <= w["t1"]]
        k = max(len(s), 1)
        w.update(samples=len(s), watts=sum(x[2] for x in s) / k, mhz=sum(x[1] for x in s) / k,
                 mhz_min=min((x[1] for x in s), default=float("nan")), capped=sum(1 for x in s if x[3] & 0x4) / k)


def _window(fn, secs: float) -> dict:
    """One workload's window: one second of warm-up (the board reaches its steady power), then ``fn`` back to back
    for ``secs`` seconds (a sync every 10 calls); t0 / t1 in epoch seconds, us a call by CUDA events over the window."""
    fn()
    torch.cuda.synchronize()
    t_end = time.time() + 1.0
    while time.time() < t_end:
        fn()
        torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.time()
    e0.record()
    iters = 0
    while time.time() - t0 < secs:
        for _ in range(10):
            fn()
        iters += 10
        torch.cuda.synchronize()
    e1.record()
    torch.cuda.synchronize()
    return dict(t0=t0, t1=time.time(), iters=iters, us=e0.elapsed_time(e1) * 1e3 / iters)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="copy,pbda_bwd,skel,skel:LOCK=2,bwd")
    ap.add_argument("--secs", type=float, default=4.0)
    ap.add_argument("--out", default=os.environ.get("OUT") or ".")
    a = ap.parse_args(argv)
    rec = probe_record(secs=a.secs)
    windows = rec["rows"]
    smi_path = os.path.join(a.out, "power_probe_smi.csv")
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active",
                            "--format=csv,noheader,nounits", "-lms", "100"], stdout=open(smi_path, "w"))
    try:
        for spec in a.rows.split(","):
            try:   # a row that fails is logged; the others run
                windows.append(dict(row=spec, **_window(_workload(spec), a.secs)))
            except Exception:  # noqa: BLE001  (a probe: report and go on)
                log_error(rec["errors"], spec)
            time.sleep(1.5)   # cool-down between rows
    finally:
        time.sleep(0.3)
        smi.terminate()
        smi.wait()
    with open(smi_path) as fh:
        summarize(windows, parse_smi(fh))
    with open(os.path.join(a.out, "power_probe.json"), "w") as fh:
        json.dump(rec, fh, indent=1)
    print(f"{'row':<16} {'us':>9} {'W':>7} {'MHz':>7} {'min':>6} {'capped':>7} samples")
    for w in windows:
        print(f"{w['row']:<16} {w['us']:9.1f} {w['watts']:7.1f} {w['mhz']:7.0f} {w['mhz_min']:6.0f} "
              f"{100 * w['capped']:6.0f}% {w['samples']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
