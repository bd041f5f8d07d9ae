#!/usr/bin/env python3
"""GPU timing of the CuTe DSL mhc_h_post_bda (tilekernels/mhc/cute_post_bda.py) at the issue's shape.

T=32768, n=4, C=7168, bf16 residual / x / bias, h_res / h_post fp32 and bf16. Times (do_bench
median, benchmarks/_gpu.bench): the kernels alone (fwd_into, bwd_into) at the heuristic's config
and the A/B configs of tests/mhc/test_mhc_cute_post_bda.py (each run once first and compared bitwise with
the default's results: "(DIFFERS)" marks a different summation order, e.g. other thread counts); and the op through the
registry (backend="cute") in the peers' harness: fwd with plain tensors, fwd+bwd as
torch.autograd.grad(out, leaves, same grad output) (no .grad accumulation). Bytes by hand (every
input read once, every output written once): fwd 4.23 GB, bwd 6.58 GB with fp32 h. % of the copy
bandwidth measured in the same process (and of 4.27 TB/s). Proposes (winner.json) the shape-general
fields (GENERAL_FIELDS: FG, FSTREAM, BSTREAM, UNR) of the fastest fwd and bwd variants that beat the
default by > 0.5% over both h dtypes, and times the registry's fwd+bwd at that proposal; the test file
can then run at it (TK_TEST_PB_CUTE_CFG, run16/H/run2.sh). Prints a table; JSON to --out.

    source .gpu-cute/env.sh && python3 benchmarks/probes/mhc_cute_post_bda_time.py --out "$OUT"
    ... --chain-ab rev --rounds 5   # the backward right after the forward, the heuristic against REV (session 43)
    ... --registry-only --h-order fp32,fp32bf,bf16,fp32,fp32bf,bf16   # fp32 h holding bf16 values (session 54)
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "tests", "mhc")]

import torch  # noqa: E402

from _gpu import bench, copy_gb_s, device_env, log_error  # noqa: E402

T, n, C = 32768, 4, 7168
BF, F32 = torch.bfloat16, torch.float32
AB: dict = {}
FWD_FIELDS = GENERAL_FIELDS = ()


def _load_ab():
    """The A/B configs the tests check, which of their fields are the fwd kernel's, which hold at
    any shape (imported from the test file, which needs the CuTe DSL)."""
    global AB, FWD_FIELDS, GENERAL_FIELDS
    import test_mhc_cute_post_bda as t

    AB, FWD_FIELDS, GENERAL_FIELDS = t.AB_CONFIGS, t.FWD_FIELDS, t.GENERAL_FIELDS


def propose(rows, margin: float = 0.005) -> dict:
    """The shape-general fields (GENERAL_FIELDS) of the fastest fwd and the fastest bwd variant,
    summed over both h dtypes, where it beats the heuristic's config by more than ``margin``."""
    tot: dict = {}
    for r in rows:
        tot[r["what"]] = tot.get(r["what"], 0.0) + r["ms"]
    out = {}
    for p, default in (("fwd", "fwd kernel"), ("bwd", "bwd kernels")):
        if default not in tot:
            continue
        best, best_ms = None, tot[default] * (1 - margin)
        for name, kw in AB.items():
            key = f"{p} {name}"
            if set(kw) <= set(GENERAL_FIELDS) and key in tot and tot[key] < best_ms:
                best, best_ms = kw, tot[key]
        out.update(best or {})
    return out


# --h-order's h kinds: name -> (h dtype, values rounded to bf16 first). "fp32bf" is fp32 h holding bf16 values (16 zero
# low mantissa bits): the fp32-h kernels, bytes and instructions with bf16 h's operand bits (session 54: is fp32 h's
# ~13 us over bf16 h on the H200 its data's switching energy under the 700 W cap rather than its code?).
H_KINDS = {"fp32": (F32, False), "bf16": (BF, False), "fp32bf": (F32, True)}


def _case(hd, bf_values: bool = False):
    """Fresh random inputs (h_res, residual, h_post, x, bias) and dout at the headline shape, h in ``hd`` (rounded to
    bf16 values first where ``bf_values``)."""
    g = lambda *s, dt=BF: torch.randn(*s, device="cuda").to(dt)  # noqa: E731
    hr, hp = g(T, n, n, dt=F32) * 0.5, g(T, n, dt=F32)
    if bf_values:
        hr, hp = hr.to(BF), hp.to(BF)
    return (hr.to(hd), g(T, n, C), hp.to(hd), g(T, C), g(C)), g(T, n, C)


@contextlib.contextmanager
def _heuristic_with(kw: dict):
    """Within the block, PostBdaCuteCfg.heuristic returns its configs with the fields ``kw`` (what the registry
    runs then); the cached classmethod is put back after."""
    from tilekernels.mhc import cute_post_bda as cp

    raw, orig = cp.PostBdaCuteCfg.__dict__["heuristic"], cp.PostBdaCuteCfg.heuristic
    cp.PostBdaCuteCfg.heuristic = classmethod(lambda cls, *args: dataclasses.replace(orig(*args), **kw))
    try:
        yield
    finally:
        cp.PostBdaCuteCfg.heuristic = raw


def registry_only(a):
    """The registry's fwd and fwd+bwd for each of --h-order's h kinds in turn (same harness); on the cute backend the
    two kernels alone too (fwd_into, bwd_into at the heuristic's config)."""
    import registry
    from tilekernels.mhc import cute_post_bda as cp

    op = registry.get("mhc_h_post_bda")
    res = {"env": device_env(), "backend": a.backend, "rows": []}
    for kind in a.h_order.split(","):
        hd, bfv = H_KINDS[kind]
        ins, dout = _case(hd, bfv)
        leaves = [t.detach().requires_grad_(True) for t in ins]
        plain = [t.detach() for t in ins]
        out, grads = torch.empty_like(ins[1]), [torch.empty_like(t) for t in ins]
        torch.autograd.grad(op(*leaves, backend=a.backend), leaves, dout)
        rows = [("registry fwd", lambda: op(*plain, backend=a.backend)),
                ("registry fwd+bwd", lambda: torch.autograd.grad(op(*leaves, backend=a.backend), leaves, dout))]
        if a.backend == "cute":
            rows += [("fwd_into", lambda: cp.fwd_into(*plain, out)),
                     ("bwd_into", lambda: cp.bwd_into(dout, *plain, *grads))]
        for what, fn in rows:
            ms = bench(fn, a.rep)
            res["rows"].append({"h": kind, "what": f"{what} ({a.backend})", "ms": round(ms, 4)})
            print(f"{kind:9s} {what} ({a.backend}) {ms:8.4f} ms", flush=True)
        ins = dout = leaves = plain = out = grads = None
    with open(os.path.join(a.out, f"mhc_post_bda_{a.backend}_time.json"), "w") as f:
        json.dump(res, f, indent=1)


def chain_ab(a):
    """--chain-ab NAMES: what a bwd variant gains when the backward directly follows the forward (REV: the forward's
    last reads still in L2), which the bwd kernels' own rows (L2 flushed before each call) cannot show. Per h dtype,
    --rounds rounds alternating the heuristic and each variant: the kernels alone in turn (fwd_into then bwd_into)
    and the registry's fwd+bwd in the peers' harness (the variant through the heuristic, as a default would run)."""
    _load_ab()
    import registry
    from tilekernels.mhc import cute_post_bda as cp

    op = registry.get("mhc_h_post_bda")
    names = [v for v in a.chain_ab.split(",") if v]
    res = {"env": device_env(), "shape": dict(T=T, n=n, C=C), "rows": [], "errors": []}
    for hd in (F32, BF):
        hn = str(hd)[6:]
        ins, dout = _case(hd)
        out = torch.empty_like(ins[1])
        grads = [torch.empty_like(t) for t in ins]
        leaves = [t.detach().requires_grad_(True) for t in ins]
        times: dict = {}
        for _ in range(a.rounds):
            for name in ["default", *names]:
                kw = {} if name == "default" else AB[name]
                cfg = dataclasses.replace(cp.PostBdaCuteCfg.heuristic(n, C, 2, True), **kw)
                try:
                    def chain(cfg=cfg):
                        cp.fwd_into(*ins, out, cfg=cfg)
                        cp.bwd_into(dout, *ins, *grads, cfg=cfg)

                    def step():
                        return torch.autograd.grad(op(*leaves, backend="cute"), leaves, dout)

                    with _heuristic_with(kw):
                        chain(), step()
                        for what, fn in (("kernels fwd, bwd", chain), ("registry fwd+bwd", step)):
                            times.setdefault((what, name), []).append(bench(fn, a.rep))
                except Exception:  # noqa: BLE001
                    log_error(res["errors"], f"{hn} {name}")
        for (what, name), ms in times.items():
            med = sorted(ms)[len(ms) // 2]
            res["rows"].append({"h": hn, "what": f"{what} {name}", "ms": round(med, 4),
                                "rounds": [round(v, 4) for v in ms]})
            print(f"{hn:9s} {what:18s} {name:10s} {med:8.4f} ms  rounds {' '.join(f'{v:.4f}' for v in ms)}",
                  flush=True)
        ins = dout = out = grads = leaves = None
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "mhc_post_bda_chain_ab.json"), "w") as f:
        json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--backend", default="cute",
                    help="cute: kernels, A/B configs and the registry; another (cutile): the registry rows only")
    ap.add_argument("--registry-only", action="store_true", help="the registry rows only (any backend)")
    ap.add_argument("--grids", default="", help="also the bwd kernels on these grids (comma list; session 20)")
    ap.add_argument("--no-ab", action="store_true", help="skip the A/B configs (and the proposal)")
    ap.add_argument("--ab", default="", help="only these A/B configs (comma list of names)")
    ap.add_argument("--h-order", default="fp32,bf16",
                    help="--registry-only: the h kinds in turn (H_KINDS: fp32, bf16, fp32bf; e.g. bf16,fp32,bf16,fp32: an order "
                    "effect?)")
    ap.add_argument("--chain-ab", default="", help="A/B configs timed with the backward right after the forward "
                    "(comma list; e.g. rev), against the heuristic, --rounds rounds interleaved; nothing else")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.chain_ab:
        return chain_ab(a)
    import registry
    if a.backend != "cute" or a.registry_only:
        return registry_only(a)
    _load_ab()
    from tilekernels.mhc import cute_post_bda as cp

    res = {"env": device_env(), "shape": dict(T=T, n=n, C=C), "rows": [], "errors": []}
    copy = copy_gb_s()
    res["copy_gb_s"] = copy
    print(f"copy {copy:.0f} GB/s", flush=True)
    op = registry.get("mhc_h_post_bda")
    for hd in (F32, BF):
        hn = str(hd)[6:]
        ins, dout = _case(hd)
        hb = hd.itemsize
        big = 2 * T * n * C
        bytes_f = hb * T * (n * n + n) + big + 2 * T * C + 2 * C + big
        bytes_b = 3 * big + 2 * hb * T * (n * n + n) + 2 * (2 * T * C) + 2 * 2 * C
        out = torch.empty_like(ins[1])
        grads = [torch.empty_like(t) for t in ins]
        base = cp.PostBdaCuteCfg.heuristic(n, C, 2, True)

        def row(name, ms, nbytes):
            r = {"h": hn, "what": name, "ms": round(ms, 4), "gb": round(nbytes / 1e9, 3),
                 "pct_copy": round(100 * nbytes / ms / 1e6 / copy, 1), "pct_4270": round(100 * nbytes / ms / 1e6 / 4270, 1)}
            res["rows"].append(r)
            print(f"{hn:9s} {name:24s} {ms:8.4f} ms {r['pct_copy']:6.1f}% of copy", flush=True)

        try:
            cp.fwd_into(*ins, out)
            cp.bwd_into(dout, *ins, *grads)
            want = [out.clone()] + [t.clone() for t in grads]
            row("fwd kernel", bench(lambda: cp.fwd_into(*ins, out), a.rep), bytes_f)
            row("bwd kernels", bench(lambda: cp.bwd_into(dout, *ins, *grads), a.rep), bytes_b)
            for gr in [int(v) for v in a.grids.split(",") if v]:  # the persistent grid vs more CTAs (dbias partials)
                cp.bwd_into(dout, *ins, *grads, grid=gr)
                same = all(torch.equal(x, y) for x, y in zip(grads[:4], want[1:5]))
                row(f"bwd grid {gr}{'' if same else ' (DIFFERS)'}",
                    bench(lambda: cp.bwd_into(dout, *ins, *grads, grid=gr), a.rep), bytes_b)
            only = set(a.ab.split(",")) if a.ab else None
            for name, kw in ({} if a.no_ab else {k: v for k, v in AB.items() if not only or k in only}).items():
                cfg = dataclasses.replace(base, **kw)
                try:
                    if set(kw) <= set(FWD_FIELDS):   # a fwd variant
                        cp.fwd_into(*ins, out, cfg=cfg)
                        row(f"fwd {name}{'' if torch.equal(out, want[0]) else ' (DIFFERS)'}",
                            bench(lambda: cp.fwd_into(*ins, out, cfg=cfg), a.rep), bytes_f)
                        continue
                    cp.bwd_into(dout, *ins, *grads, cfg=cfg)
                    same = all(torch.equal(x, y) for x, y in zip(grads[:4], want[1:5]))  # dbias: other sums
                    row(f"bwd {name}{'' if same else ' (DIFFERS)'}",
                        bench(lambda: cp.bwd_into(dout, *ins, *grads, cfg=cfg), a.rep), bytes_b)
                except Exception:  # noqa: BLE001
                    log_error(res["errors"], f"{hn} {name}")
            # the registry entry in the peers' harness
            leaves = [t.detach().requires_grad_(True) for t in ins]
            plain = [t.detach() for t in ins]
            o = op(*leaves, backend="cute")
            torch.autograd.grad(o, leaves, dout)
            row("registry fwd", bench(lambda: op(*plain, backend="cute"), a.rep), bytes_f)
            row("registry fwd+bwd", bench(lambda: torch.autograd.grad(op(*leaves, backend="cute"), leaves, dout),
                                          a.rep), bytes_f + bytes_b)
        except Exception:  # noqa: BLE001
            log_error(res["errors"], f"{hn}")
        ins = dout = out = grads = want = None
        torch.cuda.empty_cache()
    res["proposal"] = prop = propose(res["rows"])
    with open(os.path.join(a.out, "winner.json"), "w") as f:
        json.dump(prop, f)
    print("proposed default fields:", prop, flush=True)
    if prop:   # the op through the registry at the proposal (the heuristic's configs with its fields)
        try:
            with _heuristic_with(prop):
                for hd in (F32, BF):
                    ins, dout = _case(hd)
                    leaves = [t.detach().requires_grad_(True) for t in ins]
                    torch.autograd.grad(op(*leaves, backend="cute"), leaves, dout)
                    ms = bench(lambda: torch.autograd.grad(op(*leaves, backend="cute"), leaves, dout), a.rep)
                    res["rows"].append({"h": str(hd)[6:], "what": "registry fwd+bwd (proposal)", "ms": round(ms, 4)})
                    print(f"{str(hd)[6:]:9s} registry fwd+bwd (proposal) {ms:8.4f} ms", flush=True)
                    ins = dout = leaves = None
        except Exception:  # noqa: BLE001
            log_error(res["errors"], "proposal")
    with open(os.path.join(a.out, "mhc_cute_post_bda_time.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("\n| h | what | ms | % copy |")
    for r in res["rows"]:
        print(f"| {r['h']} | {r['what']} | {r['ms']:.4f} | {r.get('pct_copy', '')} |")


if __name__ == "__main__":
    main()
