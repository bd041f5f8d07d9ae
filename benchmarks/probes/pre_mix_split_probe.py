#!/usr/bin/env python3
"""mhc_pre's backward mix, one kernel (padded-tile Sinkhorn backward, the n <= 4 design through session 22) against
the split mix (cutile_pre.mhc_pre_bwd_sk: the entries Sinkhorn backward alone, then mhc_pre_bwd_rest: the elementwise
rest), on the same inputs: outputs compared (dproj, dr, h_pre^T, dhbias, each against the one-kernel mix's, with the
suite's fp32 tolerance: the designs sum the Sinkhorn steps in different layouts) and the mix's kernels timed alone
and with the dh_pre pass (do_bench medians, us).

    source .gpu-cutile/env.sh && python3 benchmarks/probes/pre_mix_split_probe.py [--T 32768] [--tt-r 128,64] [--tt 64]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

from _gpu import bench  # noqa: E402
from pre_mix_overlap_probe import PARAMS, pre_inputs  # noqa: E402


def main():
    from tilekernels.mhc import cutile_pre as pre
    from tilekernels.testing import rel_err, tolerance

    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--C", type=int, default=7168)
    ap.add_argument("--tt-r", default="128,64")
    ap.add_argument("--tt", default="", help="also the split mix with these TT (mhc_pre_bwd_sk's tokens a block)")
    ap.add_argument("--rep", type=int, default=200)
    o = ap.parse_args()
    T, n, C = o.T, o.n, o.C
    N = n * n + 2 * n
    dev, bf = "cuda", torch.bfloat16
    base = pre.PreCfg.heuristic(T, n, C, 20, mix_entries=False)
    x, weight, hbias, proj, r, grads = pre_inputs(T, n, C, base)
    designs = {"one kernel (tile)": base}
    for tr in [int(v) for v in o.tt_r.split(",")]:
        designs[f"split TT_R={tr}"] = dataclasses.replace(pre.PreCfg.heuristic(T, n, C, 20, mix_split=True), TT_R=tr)
    for tt in [int(v) for v in o.tt.split(",") if v]:
        designs[f"split TT={tt}"] = dataclasses.replace(pre.PreCfg.heuristic(T, n, C, 20, mix_split=True), TT=tt)
    res, ref = {}, None
    for name, cfg in designs.items():
        dweight, dbias = torch.empty(N, n * C, device=dev, dtype=bf), torch.empty(N, device=dev)
        lns = pre.bwd_launches(*grads, x, weight, hbias, proj, r, None, dweight, dbias, *PARAMS, cfg=cfg)
        for ln in lns:
            ln.run()
        mix = next(ln for ln in lns if ln.kernel in pre.MIX_KERNELS)
        outs = dict(zip(("dproj", "dr", "hpre_t"), (t.clone() for t in mix.args[6:9])), dbias=dbias.clone())
        if ref is None:
            ref = outs
        errs = {k: rel_err(v, ref[k]) for k, v in outs.items()}
        ok = all(e < tolerance("float32") for e in errs.values()) and all(torch.isfinite(v).all() for v in outs.values())
        mixk = [ln for ln in lns if ln.kernel not in (pre.agg.mhc_agg_bwd, pre.mhc_pre_dbias)]
        head = [ln for ln in lns if ln.kernel is not pre.mhc_pre_dbias]
        t_mix = bench(lambda: [ln.run() for ln in mixk], o.rep) * 1e3
        t_head = bench(lambda: [ln.run() for ln in head], o.rep) * 1e3
        each = {ln.kernel._pyfunc.__name__: bench(ln.run, o.rep) * 1e3 for ln in mixk}
        res[name] = (t_mix, t_head, each, errs, ok)
        print(f"{name:20s} mix {t_mix:7.1f} us  dh_pre pass + mix {t_head:7.1f} us  {each}  "
              f"{'ok' if ok else 'MISMATCH'} {errs}", flush=True)
    print(f"\nT={T} n={n} C={C} (us; errors against the one-kernel mix, fp32 tolerance {tolerance('float32')})")
    for name, (tm, th, each, errs, ok) in res.items():
        print(f"{name:20s} mix {tm:7.1f}  pass+mix {th:7.1f}  {'ok' if ok else 'MISMATCH'}  "
              f"worst {max(errs.values()):.2e}")


if __name__ == "__main__":
    main()
