#!/usr/bin/env python3
"""Probe: mhc_post_pre's three CuTe DSL passes timed alone at configs side by side (H200), in alternating rounds.

Why: the op's fwd+bwd rows (mhc_post_pre_variants.py) drift by 50-100 us between identical rows of one run, more
than a pass variant moves; this times each pass's kernel by itself, the variants of a pass in turn within each round
(the order rotated every round), and reports each variant's median over the rounds. Inputs are random (the passes'
time does not depend on the values); the outputs are not checked (the GPU tests do that).

Passes and variants (``--rows``, comma list of PASS[:FIELD=V[:FIELD=V]]): ``bwd`` cute_post_pre_bwd (the default
backward's config: with_dwpre of the heuristic), ``fwd`` cute_post_pre_fwd, ``dhdw`` cute_post_pre_dhdw, each with
fields of its config replaced, e.g. ``bwd,bwd:SPLIT=8,fwd,fwd:STAGES=2``. T=32768, n=4, C=7168, bf16, bias on.
(Session 37 ran it on the passes' LOCK option, 5f278ea, since reverted: the mHC ledger.)

    source .gpu-cute/env.sh && python3 benchmarks/probes/post_pre_pass_ab.py --rows bwd,bwd:SPLIT=8 --rounds 5
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import torch  # noqa: E402

from _gpu import bench, log_error, probe_record  # noqa: E402


def _cfg(name, changes, n, C, N, npad):
    from tilekernels.mhc import cute_post_pre_bwd as K
    from tilekernels.mhc import cute_post_pre_dhdw as DD
    from tilekernels.mhc import cute_post_pre_fwd as F

    base = {"bwd": lambda: K.with_dwpre(K.PostPreBwdCuteCfg.heuristic(n, C, N, True)),
            "fwd": lambda: F.PostPreFwdCuteCfg.heuristic(n, C, N, npad, True),
            "dhdw": lambda: DD.PostPreDhdwCuteCfg.heuristic(n, C, N, npad)}[name]()
    return dataclasses.replace(base, **changes)


def _runner(name, cfg, T, n, C, N, npad):
    """A no-argument callable running one pass at cfg on fresh random inputs of issue 15's shape."""
    from tilekernels.mhc import cute_post_pre_bwd as K
    from tilekernels.mhc import cute_post_pre_dhdw as DD
    from tilekernels.mhc import cute_post_pre_fwd as F

    d, bf, f32 = "cuda", torch.bfloat16, torch.float32

    def rnd(*shape, dtype=bf):
        return torch.randn(*shape, device=d).to(dtype)

    ntm = -(-T // 64)
    if name == "bwd":
        ins = [rnd(T, n, C), rnd(T, n, C), rnd(T, C), rnd(T, C), rnd(C)]
        wp = K.permuted_weight(rnd(N, n * C), cfg)
        small = [rnd(T, N, dtype=f32), rnd(T, dtype=f32), rnd(T, dtype=f32).abs() + 0.5, rnd(T, n, n, dtype=f32),
                 rnd(T, n, dtype=f32), rnd(n, T, dtype=f32)]
        outs = [torch.empty(T, n, C, dtype=bf, device=d), torch.empty(T, C, dtype=bf, device=d),
                torch.empty(ntm, C, dtype=f32, device=d), torch.empty(cfg.SPLIT, T, n, n, dtype=f32, device=d),
                torch.empty(cfg.SPLIT, T, n, dtype=f32, device=d), torch.empty(ntm, n, n * C, dtype=f32, device=d)]
        ln = K.launch(cfg)
        return lambda: ln.run(*ins, wp, *small, *outs, T, 1e-6)
    if name == "fwd":
        ins = [rnd(T, n, C), rnd(T, C), rnd(C), rnd(N, n * C), rnd(T, n, n, dtype=f32), rnd(T, n, dtype=f32)]
        outs = [torch.empty(T, n, C, dtype=bf, device=d), torch.empty(cfg.SPLIT, T, npad, dtype=f32, device=d),
                torch.empty(cfg.SPLIT, T, dtype=f32, device=d)]
        ln = F.launch(cfg)
        return lambda: ln.run(*ins, *outs, T)
    gm = DD.row_groups(T)
    ins = [rnd(T, n, C), rnd(T, C), rnd(T, npad, dtype=f32)]
    outs = [torch.empty(cfg.S, T, n, dtype=f32, device=d), torch.empty(gm + 1, N, n * C, dtype=f32, device=d)]
    ln = DD.launch(cfg)
    return lambda: ln.run(*ins, *outs, T, gm)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="bwd,fwd,dhdw")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    a = ap.parse_args(argv)
    T, n, C = 32768, 4, 7168
    N, npad = n * n + 2 * n, 32
    rec = probe_record(T=T, n=n, C=C, rounds=a.rounds)
    rows = rec["rows"]
    for spec in a.rows.split(","):
        try:   # a row whose config is refused or whose launch fails is logged; the others run
            name, *kv = spec.split(":")
            changes = {k: int(v) for k, v in (x.split("=") for x in kv)}
            cfg = _cfg(name, changes, n, C, N, npad)
            fn = _runner(name, cfg, T, n, C, N, npad)
            fn()
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001  (a probe: report and go on)
            log_error(rec["errors"], spec)
            continue
        rows.append(dict(row=spec, pass_=name, cfg=dataclasses.asdict(cfg), fn=fn, us=[]))
    for rnd_ in range(a.rounds):
        k = rnd_ % len(rows)
        for r in rows[k:] + rows[:k]:
            r["us"].append(bench(r["fn"]) * 1e3)
    for r in rows:
        r.pop("fn")
        r["median_us"] = statistics.median(r["us"])
    if a.out:
        with open(os.path.join(a.out, "post_pre_pass_ab.json"), "w") as fh:
            json.dump(rec, fh, indent=1)
    print(f"mhc_post_pre passes alone, T={T} n={n} C={C}; us, do_bench medians, {a.rounds} rounds in rotated order")
    print(f"{'row':<28} {'median':>8}  rounds")
    for r in rows:
        print(f"{r['row']:<28} {r['median_us']:8.1f}  " + " ".join(f"{u:.1f}" for u in r["us"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
