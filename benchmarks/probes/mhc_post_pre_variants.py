#!/usr/bin/env python3
"""GPU timing of mhc_post_pre's backends and the cute backend's variants against the two ops composed, at issue
15's shape, in one harness (benchmarks/mhc_post_pre_check.py's: leaves' grads None per step, the same pre-made
grad outputs, do_bench median); optionally a torch.profiler kernel table per row and each row's host enqueue time.

Rows (--rows, comma list, each run in the order given; repeat a name to see the spread):
  separate          mhc_h_post_bda then mhc_pre through the registry (autograd sums their two d(out))
  cute, cutile      mhc_post_pre on that backend (its defaults)
  h_post_bda, mhc_pre  one of the two ops alone through the registry, with its own leaves and grad outputs (the
                    issue's table times them apart: "2.90 + 3.13"); with both rows the table adds their sum;
                    h_post_bda:BACKEND=b / mhc_pre:BACKEND=b: that op on backend b (timed, not counted in the sum)
  cute:K=V[:K=V]    the cute backend with its backward pass's config changed (PostPreBwdCuteCfg fields, e.g.
                    cute:CW=16, cute:STAGES=3), FWD_<field>=V the fused forward pass's (PostPreFwdCuteCfg, e.g.
                    cute:FWD_STAGES=2), PP_<field>=V cutile_post_pre.PostPreCfg's (e.g. PP_TE=32: mhc_pp_mix's
                    tokens a block), DHW_<field>=V the dh_pre + dweight pass's (PostPreDhwCuteCfg, e.g. DHW_LAG=2),
                    DHDW_<field>=V the slices pass's (PostPreDhdwCuteCfg, e.g. DHDW_STAGES=3), PRE_<field>=V
                    mhc_pre's cuTile PreCfg (e.g. PRE_TT_R=32: mhc_pre_bwd_rest's tokens a block; it also applies to
                    an "mhc_pre:PRE_<field>=V" row, timed apart but not counted in "apart"), AGG_<field>=V its
                    AggCfg's (the cuTile aggregate: AGG_REV=1 / AGG_REV_B=1, token tiles last to first, session 43),
                    FUSE_FWD=0/1 (cute_post_pre.FUSE_FWD: the fused forward pass), FUSE_DHW=0/1
                    (cute_post_pre.FUSE_DHW: dh_pre and dweight in one pass over out, cute_post_pre_dhw) or
                    SPLIT_DW=0/1 (cute_post_pre.SPLIT_DW: dweight split between the dh_pre pass and the backward
                    pass, cute_post_pre_dhdw) or CUTE_REST=0/1 (cute_post_pre.CUTE_REST: the mix's rest as
                    cute_pre_rest's kernel, else cuTile's mhc_pre_bwd_rest) or CUTE_MIX=0/1 (cute_post_pre.CUTE_MIX: the
                    fused forward's epilogue as cute_pp_mix's kernel, else cuTile's mhc_pp_mix) or CUTE_SK=0/1
                    (cute_post_pre.CUTE_SK: the mix's Sinkhorn backward as cute_sk_bwd's kernel, else mhc_pre_bwd_sk)
                    or RESIDENT=0/1 (cute_post_pre.RESIDENT: the forward as cute_post_pre_res's pass, a row tile's
                    out kept in its cluster's shared memory, then the epilogue; no aggregate), RES_CLUSTERS=V its
                    persistent clusters (cute_post_pre_res.CLUSTERS; 0: the device's active-cluster count),
                    RES_<field>=V its config's (PostPreResCuteCfg, e.g. RES_STAGES=4)
A row whose changes make a config the kernels refuse prints the error and goes on.

    (call 1) source .gpu-cutile/env.sh                      # unpacks cuTile into /tmp/tk-cutile
    (call 2) source .gpu-cute/env.sh; export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site \\
             PATH=/tmp/tk-cutile/cu13/bin:$PATH; unset CUDA_HOME CUDA_PATH
             python3 benchmarks/probes/mhc_post_pre_variants.py --rows separate,cute,cute:FUSE_FWD=1,cute,separate \\
                 [--profile] [--host] [--hbf16] [--out "$OUT"]
Prints a table last; JSON to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

from _gpu import probe_record  # noqa: E402
from mhc_post_pre_check import fused, make, separate, timings  # noqa: E402


def _apart(args, cots):
    """{row: (fn, leaves, grad outputs)} for the two ops timed alone: h_post_bda on the op's inputs with d(out);
    mhc_pre on a new leaf holding h_post_bda's output with d(layer_in, h_post_next, h_res_next)."""
    import registry
    from mhc_post_pre_check import PARAMS

    with torch.no_grad():
        out = registry.get("mhc_h_post_bda")(*args[:4], args[6])
    out = out.detach().requires_grad_()
    pre_args = [out, args[4], args[5]]
    return {"h_post_bda": (lambda a, be="auto": registry.get("mhc_h_post_bda")(*a[:4], a[4], backend=be),
                           [*args[:4], args[6]], cots[:1]),
            "mhc_pre": (lambda a, be="auto": registry.get("mhc_pre")(*a, **PARAMS, backend=be), pre_args, cots[1:])}


def _row_fn(spec: str):
    """(fn, changes) of a row spec; fn runs the op(s) on args."""
    name, *kvs = spec.split(":")
    changes = dict(kv.split("=") for kv in kvs)
    if name == "separate":
        return separate, changes
    return (lambda a: fused(a, name)), changes


# cute_post_pre's module switches a row may set (NAME=0/1)
FLAGS = ("FUSE_FWD", "FUSE_DHW", "SPLIT_DW", "CUTE_REST", "CUTE_MIX", "CUTE_SK", "RESIDENT")


class _patched:
    """Within the block: the cute backward pass's heuristic replaced by a copy with ``changes`` (ints), and
    cute_post_pre's switches (FLAGS) set when asked."""

    def __init__(self, changes: dict):
        self.changes = dict(changes)

    def __enter__(self):
        from tilekernels.mhc import cute_post_pre as cpp
        from tilekernels.mhc import cute_post_pre_bwd as K

        from tilekernels.mhc import cute_post_pre_fwd as F
        from tilekernels.mhc import cutile_post_pre as pp

        self.cpp, self.K, self.F, self.pp = cpp, K, F, pp
        self.pheur = pp.PostPreCfg.__dict__["heuristic"]
        from tilekernels.mhc import cute_post_pre_dhw as D

        self.D = D
        from tilekernels.mhc import cute_post_pre_dhdw as DD

        self.DD, self.ddheur = DD, DD.PostPreDhdwCuteCfg.__dict__["heuristic"]
        from tilekernels.mhc import cutile_pre as P

        self.P, self.preheur = P, P.PreCfg.__dict__["heuristic"]
        self.heur = K.PostPreBwdCuteCfg.heuristic
        self.dheur = D.PostPreDhwCuteCfg.__dict__["heuristic"]
        self.flags = {f: getattr(cpp, f) for f in FLAGS}
        self.fheur = F.PostPreFwdCuteCfg.__dict__["heuristic"]
        ch = {k: int(v) for k, v in self.changes.items()}
        for f in FLAGS:
            if f in ch:
                setattr(cpp, f, bool(ch.pop(f)))
        prech = {k[4:]: ch.pop(k) for k in list(ch) if k.startswith("PRE_")}
        aggch = {k[4:]: ch.pop(k) for k in list(ch) if k.startswith("AGG_")}
        aggch = {k: bool(v) if k.startswith("REV") else v for k, v in aggch.items()}
        if prech or aggch:   # mhc_pre's cuTile config (PreCfg fields, e.g. PRE_TT_R=32; AGG_: its AggCfg's)
            preinner = self.preheur.__func__.__wrapped__

            def pre_cfg(cls, *a, **k):
                c = dataclasses.replace(preinner(cls, *a, **k), **prech)
                return dataclasses.replace(c, agg=dataclasses.replace(c.agg, **aggch)) if aggch else c

            P.PreCfg.heuristic = classmethod(pre_cfg)
            ppinner = self.pheur.__func__.__wrapped__   # PostPreCfg's cache holds a PreCfg: build it anew
            pp.PostPreCfg.heuristic = classmethod(lambda cls, *a: ppinner(cls, *a))
        ddch = {k[5:]: ch.pop(k) for k in list(ch) if k.startswith("DHDW_")}
        if ddch:   # the slices pass's config (PostPreDhdwCuteCfg fields, e.g. DHDW_STAGES=3)
            ddinner = self.ddheur.__func__.__wrapped__
            DD.PostPreDhdwCuteCfg.heuristic = classmethod(
                lambda cls, *a: dataclasses.replace(ddinner(cls, *a), **ddch))
        dch = {k[4:]: ch.pop(k) for k in list(ch) if k.startswith("DHW_")}
        if dch:   # the dh_pre + dweight pass's config (PostPreDhwCuteCfg fields, e.g. DHW_LAG=2)
            dinner = self.dheur.__func__.__wrapped__
            D.PostPreDhwCuteCfg.heuristic = classmethod(lambda cls, *a: dataclasses.replace(dinner(cls, *a), **dch))
        fch = {k[4:]: ch.pop(k) for k in list(ch) if k.startswith("FWD_")}
        if fch:   # the fused forward pass's config (PostPreFwdCuteCfg fields, e.g. FWD_STAGES=2)
            inner = self.fheur.__func__.__wrapped__
            F.PostPreFwdCuteCfg.heuristic = classmethod(
                lambda cls, *a: dataclasses.replace(inner(cls, *a), **fch))
        from tilekernels.mhc import cute_post_pre_res as RS

        self.RS, self.res_clusters = RS, RS.CLUSTERS
        if "RES_CLUSTERS" in ch:   # the resident forward's persistent clusters (0: the device's count)
            RS.CLUSTERS = int(ch.pop("RES_CLUSTERS"))
        self.rheur = RS.PostPreResCuteCfg.__dict__["heuristic"]
        rch = {k[4:]: ch.pop(k) for k in list(ch) if k.startswith("RES_")}
        if rch:   # the resident forward's config (PostPreResCuteCfg fields, e.g. RES_STAGES=4)
            rinner = self.rheur.__func__.__wrapped__
            RS.PostPreResCuteCfg.heuristic = classmethod(lambda cls, *a: dataclasses.replace(rinner(cls, *a), **rch))
        pch = {k[3:]: ch.pop(k) for k in list(ch) if k.startswith("PP_")}
        if pch:   # the cuTile kernels' PostPreCfg (e.g. PP_TE=32: mhc_pp_mix's tokens a block)
            pinner = self.pheur.__func__.__wrapped__
            pp.PostPreCfg.heuristic = classmethod(lambda cls, *a: dataclasses.replace(pinner(cls, *a), **pch))
        if ch:
            orig = self.heur
            cw = ch.pop("CW", 32)
            K.PostPreBwdCuteCfg.heuristic = lambda n, C, N, hb, CW=32: dataclasses.replace(orig(n, C, N, hb, cw), **ch)

    def __exit__(self, *exc):
        for f, v in self.flags.items():
            setattr(self.cpp, f, v)
        self.D.PostPreDhwCuteCfg.heuristic = self.dheur
        self.DD.PostPreDhdwCuteCfg.heuristic = self.ddheur
        self.P.PreCfg.heuristic = self.preheur
        self.K.PostPreBwdCuteCfg.heuristic = self.heur
        self.F.PostPreFwdCuteCfg.heuristic = self.fheur
        self.pp.PostPreCfg.heuristic = self.pheur
        self.RS.CLUSTERS = self.res_clusters
        self.RS.PostPreResCuteCfg.heuristic = self.rheur


def _profile(fn, args, cots, steps: int = 5) -> list[tuple[float, int, str]]:
    """(us a step, launches a step, kernel name) of every CUDA kernel, slowest first."""
    def step():
        for a in args:
            a.grad = None
        torch.autograd.backward(fn(args), cots)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / steps, e.count // steps, e.key) for e in p.key_averages() if e.device_time_total > 0]
    return sorted(rows, reverse=True)


def _host_ms(fn, args, cots, reps: int = 20) -> tuple[float, float]:
    """Median host ms to enqueue the forward alone and one whole fwd+bwd step (synchronized before each)."""
    fw, st = [], []
    for _ in range(reps):
        for a in args:
            a.grad = None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = fn(args)
        t1 = time.perf_counter()
        torch.autograd.backward(outs, cots)
        st.append((time.perf_counter() - t0) * 1e3)
        fw.append((t1 - t0) * 1e3)
        torch.cuda.synchronize()
    return sorted(fw)[reps // 2], sorted(st)[reps // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="separate,cute,cutile,cute,separate")
    ap.add_argument("--T", default="32768", help="tokens; a comma list runs every row at each T in turn (the kernels\n"
                    "                    compile once: T is a runtime scalar)")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--C", type=int, default=7168)
    ap.add_argument("--hbf16", action="store_true")
    ap.add_argument("--profile", action="store_true", help="a torch.profiler kernel table per row")
    ap.add_argument("--host", action="store_true", help="each row's host enqueue time")
    ap.add_argument("--out")
    o = ap.parse_args()
    Ts = [int(t) for t in o.T.split(",")]
    if len(Ts) > 1:   # one record a T: <out>/T<T>/mhc_post_pre_variants.json
        for t in Ts:
            sub = None
            if o.out:
                sub = os.path.join(o.out, f"T{t}")
                os.makedirs(sub, exist_ok=True)
            _one(o, t, sub)
            torch.cuda.empty_cache()
        return
    _one(o, Ts[0], o.out)


def _one(o, T: int, out: str | None):
    """Every row at T tokens (the table and the JSON record)."""
    args, cots = make(T, o.n, o.C, "cuda", torch.bfloat16 if o.hbf16 else torch.float32)
    res = probe_record(T=T, n=o.n, C=o.C, h="bf16" if o.hbf16 else "fp32")
    apart = _apart(args, cots) if any(r.split(":")[0] in ("h_post_bda", "mhc_pre") for r in o.rows.split(",")) else {}
    for spec in o.rows.split(","):
        fn, changes = _row_fn(spec)
        a_, c_ = args, cots
        name = spec.split(":")[0]
        if name in apart:
            fn, a_, c_ = apart[name]
            if "BACKEND" in changes:
                fn = functools.partial(fn, be=changes.pop("BACKEND"))
        try:
            with _patched(changes):
                f, st = timings(fn, a_, c_)
                row = dict(row=spec, fwd_ms=f, step_ms=st)
                if o.host:
                    row["host_ms"] = _host_ms(fn, a_, c_)[1]
                if o.profile:
                    row["kernels"] = _profile(fn, a_, c_)
        except Exception as e:  # noqa: BLE001 (a refused config is a row's result)
            print(f"{spec}: {type(e).__name__}: {e}", flush=True)
            res["errors"].append(dict(row=spec, error=f"{type(e).__name__}: {e}"))
            continue
        res["rows"].append(row)
        print(f"{spec:28s} fwd {f:.4f} fwd+bwd {st:.4f}" + (f" host {row['host_ms']:.3f}" if o.host else ""), flush=True)
        for us, cnt, name in row.get("kernels", [])[:12]:
            print(f"    {us:9.1f} us  x{cnt:<2d} {name[:100]}")
    sep = [r["step_ms"] for r in res["rows"] if r["row"] == "separate"]
    base = min(sep) if sep else None
    alone = {k: min((r["step_ms"] for r in res["rows"] if r["row"] == k), default=None) for k in apart}
    apart_ms = sum(alone.values()) if len(alone) == 2 and None not in alone.values() else None
    print(f"\nmhc_post_pre variants, {res['env'].get('device', '?')}, T={T} n={o.n} C={o.C}, "
          f"{'bf16' if o.hbf16 else 'fp32'} h; do_bench median")
    if apart_ms:
        res["apart_ms"] = apart_ms
        print(f"the two ops timed apart (best h_post_bda + best mhc_pre rows): {apart_ms:.3f} ms")
    print(f"{'row':28s} {'fwd ms':>8s} {'fwd+bwd':>8s} {'vs separate':>12s} {'vs apart':>9s}")
    for r in res["rows"]:
        vs = f"{100 * (1 - r['step_ms'] / base):11.1f}%" if base else f"{'-':>12s}"
        va = (f"{100 * (1 - r['step_ms'] / apart_ms):8.1f}%" if apart_ms and r["row"].split(":")[0] not in apart
              else f"{'-':>9s}")
        print(f"{r['row']:28s} {r['fwd_ms']:8.3f} {r['step_ms']:8.3f} {vs} {va}")
    if out:
        with open(os.path.join(out, "mhc_post_pre_variants.json"), "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
