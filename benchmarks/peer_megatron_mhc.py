#!/usr/bin/env python3
"""Same-run GPU timing of the public peer "Megatron-LM mHC fused kernels" next to ours.

The peer (megatron/core/fusions/fused_mhc_kernels.py + triton_mhc_kernels.py of
NVIDIA/Megatron-LM, dev-branch unified dispatch) is NOT part of this repository:
it lives, verbatim and git-ignored, in .peers/megatron/ (provenance in
.peers/megatron/SOURCE.txt); .peers/stubs/ holds the few megatron names it
imports. Nothing of it is copied here: this file only calls its public API.

Ops (T = s*b = 8192*4 = 32768 tokens, n = 4, C = 7168, bf16 activations):
  mhc_sinkhorn (20 iters, eps 1e-6), mhc_h_aggregate, mhc_h_post_bda (bias given),
  mhc_proj_rms (x [T, n*C], weight [n*n+2n, n*C], eps 1e-6).
Peer variants: "dispatch" = its public fused_* API (Triton first, then cuTile);
"cutile" = its cuTile-only path (CutileSinkhornKnopp, CutileHAggregate, and its
_cutile_h_post_bda_fwd/_bwd pair; proj_rms has only the cuTile path).
For each op: the same fresh random inputs for ours (registry.get(op), backend
auto = cutile on the GPU) and the peer (views [s, b, ...] of the same tensors);
the peer's forward (and grads) checked against ours and both against a float64
reference; fwd and fwd+bwd timed with triton.testing.do_bench (median), eagerly
and replayed from a CUDA graph. Prints a table; writes JSON to --out.

On the GPU host, from the repository root (the run must carry .gpu-cutile and .peers):

    source .gpu-cutile/env.sh
    python3 benchmarks/peer_megatron_mhc.py --out "$OUT"

On any machine (no GPU): python3 benchmarks/peer_megatron_mhc.py --check-import
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, ".peers")
sys.path[:0] = [ROOT, os.path.join(PEERS, "stubs"), os.path.join(PEERS, "megatron")]

import torch  # noqa: E402

from _gpu import bench, log_error  # noqa: E402

S, B, n, C = 8192, 4, 4, 7168
T, K, N = S * B, n * C, n * n + 2 * n
ITERS, EPS = 20, 1e-6
BF, F32 = torch.bfloat16, torch.float32
RESULTS: dict = {"records": [], "errors": []}

# What differs between the peer and OPS.md (from reading the peer's code; the measured
# rel errors below say how much it matters).
SEMANTICS = {
    "mhc_sinkhorn": "Same forward as OPS.md (exp(l - rowmax), iters x [row /= rowsum+eps, col /= colsum+eps]), "
                    "fp32 in/out, same [..., n, n] layout. Peer backward ends with grad * exp(l - rowmax), i.e. it "
                    "treats the row max as a constant and omits OPS.md's row-max term (O(eps)): dlogits may differ "
                    "at the eps level only.",
    "mhc_h_aggregate": "Same math. Peer takes x [s, b, n, C], h_pre [s, b, n] and returns [s, b, C] in x.dtype: views "
                       "of ours [T, n, C] (T = s*b, s-major). Its Triton fwd accumulates in fp32; its cuTile bwd "
                       "multiplies dout*x and dout*h_pre in the input dtype before reducing; dh_pre in h_pre.dtype.",
    "mhc_h_post_bda": "Same math (h_res[t,i,j] mixes residual[t,j,:]), views [s, b, ...] of ours. Peer output dtype is "
                      "h_res.dtype (OPS.md: residual's; equal when h is bf16, the default here); peer dbias = sum over "
                      "T of the bf16-rounded dx (OPS.md: fp32 from the unrounded dx).",
    "mhc_proj_rms": "Same math (proj = x W^T, r = 1/(||x||/sqrt(K) + eps)). Peer returns proj and r in x.dtype "
                    "(bf16; OPS.md: fp32) and r as [M, 1]; its cuTile fwd squares x in bf16 and keeps the sum of "
                    "squares in a bf16 buffer, so r carries bf16-level error; its grads arrive in bf16 (its outputs' "
                    "dtype). Only a cuTile path (no Triton) in the peer.",
}




def graph_bench(fn, rep):
    """Capture fn (already warm) in a CUDA graph and time its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ms = bench(g.replay, rep)
    del g
    return ms


log_err = functools.partial(log_error, RESULTS["errors"])


def _tup(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def rnd(*shape, dtype=BF, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


# ------------------------------------------------------------------ peer
def import_peer(quick: bool):
    import megatron.core.fusions.fused_mhc_kernels as fm

    info = {"file": fm.__file__, "cutile": fm._CUTILE_AVAILABLE, "triton": fm._TRITON_AVAILABLE,
            "cutile_experimental_autotune": fm._CUTILE_EXPERIMENTAL_AVAILABLE, "quick_triton_autotune": quick}
    tm = None
    if fm._TRITON_AVAILABLE:
        import megatron.core.fusions.triton_mhc_kernels as tm

        if quick:  # not the peer's own search: keep only its num_warps=4 configs (16 of 48)
            for name in _TRITON_KERNELS:
                at = getattr(tm, name)
                keep = [c for c in at.configs if c.num_warps == 4]
                at.configs = keep or at.configs
    src = os.path.join(PEERS, "megatron", "SOURCE.txt")
    if os.path.exists(src):
        info["source"] = open(src).read()
    return fm, tm, info


_TRITON_KERNELS = ("_triton_sinkhorn_fwd_kernel", "_triton_sinkhorn_bwd_kernel", "_triton_h_agg_fwd_kernel",
                   "_triton_hpb_fwd_kernel", "_triton_hpb_bwd_g_x_orig_kernel", "_triton_hpb_bwd_g_hp_hr_kernel")


def _peer_cutile_post_bda(fm):
    """The peer's cuTile-only h_post_bda (it exposes the fwd/bwd pair, not a Function)."""

    class _PeerCutilePostBda(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h_res, residual, h_post, x, bias):
            ctx.save_for_backward(h_res, residual, h_post, x, bias)
            return fm._cutile_h_post_bda_fwd(h_res, residual, h_post, x, bias)

        @staticmethod
        def backward(ctx, dout):
            return fm._cutile_h_post_bda_bwd(dout.contiguous(), *ctx.saved_tensors)

    return _PeerCutilePostBda.apply


# ------------------------------------------------------------------ problems
class Case:
    """One op: our inputs/params, the peer's callables on views of the same tensors,
    the output grads, and the float64 reference."""

    def __init__(self, op, fm, h_dtype):
        import registry
        from tilekernels.mhc import reference as ref

        self.op = op
        f = registry.get(op)
        v4 = lambda t, *tail: t.view(S, B, *tail)  # noqa: E731  [T, ...] -> [s, b, ...]
        if op == "mhc_sinkhorn":
            lg = rnd(T, n, n, dtype=F32, scale=2.0)
            self.ins, self.gouts = [lg], (rnd(T, n, n, dtype=F32),)
            self.ours = lambda lg: f(lg, iters=ITERS, eps=EPS)
            self.peer = {"dispatch": lambda lg: fm.fused_sinkhorn(v4(lg, n, n), ITERS, EPS),
                         "cutile": lambda lg: fm.CutileSinkhornKnopp.apply(v4(lg, n, n), ITERS, EPS)}
            self.ref64 = lambda: (ref.sinkhorn(lg.double(), ITERS, EPS),)
        elif op == "mhc_h_aggregate":
            x, h = rnd(T, n, C), rnd(T, n, dtype=h_dtype)
            self.ins, self.gouts = [x, h], (rnd(T, C),)
            self.ours = lambda x, h: f(x, h)
            self.peer = {"dispatch": lambda x, h: fm.fused_h_aggregate(v4(x, n, C), v4(h, n)),
                         "cutile": lambda x, h: fm.CutileHAggregate.apply(v4(x, n, C), v4(h, n))}
            self.ref64 = lambda: (ref.h_aggregate(x.double(), h.double()),)
        elif op == "mhc_h_post_bda":
            hr, hp = rnd(T, n, n, dtype=h_dtype, scale=0.5), rnd(T, n, dtype=h_dtype)
            res, x, b = rnd(T, n, C), rnd(T, C), rnd(C)
            self.ins, self.gouts = [hr, res, hp, x, b], (rnd(T, n, C),)
            self.ours = lambda hr, res, hp, x, b: f(hr, res, hp, x, b)
            cut = _peer_cutile_post_bda(fm) if fm._CUTILE_AVAILABLE else None

            def peer(fn):
                return lambda hr, res, hp, x, b: fn(v4(hr, n, n), v4(res, n, C), v4(hp, n), v4(x, C), b)

            self.peer = {"dispatch": peer(fm.fused_h_post_bda)}
            if cut is not None:
                self.peer["cutile"] = peer(cut)
            self.ref64 = lambda: (ref.h_post_bda(hr.double(), res.double(), hp.double(), x.double(), b.double()),)
        elif op == "mhc_proj_rms":
            x, w = rnd(T, K), rnd(N, K, scale=K ** -0.5)
            self.ins, self.gouts = [x, w], (rnd(T, N, dtype=F32), rnd(T, dtype=F32))
            self.ours = lambda x, w: f(x, w, eps=EPS)
            self.peer = {"dispatch": lambda x, w: fm.fused_proj_rms(x, w, EPS)}  # cuTile only in the peer
            self.ref64 = lambda: ref.proj_rms(x.double(), w.double(), EPS)
        else:
            raise ValueError(op)


def run_side(fn, ins, gouts, rec, key, rep, graphs, label):
    """Time fn's fwd and fwd+bwd; return (outs, grads) of the first call (in fn's own layout)."""
    leaves = [t.detach().requires_grad_(True) for t in ins]
    plain = [t.detach() for t in ins]
    t0 = time.time()
    outs = _tup(fn(*leaves))
    # grads for the peer in its own outputs' dtype/shape (same values as ours)
    gouts = tuple(g.reshape(o.shape).to(o.dtype) for g, o in zip(gouts, outs))
    grads = torch.autograd.grad(outs, leaves, gouts, allow_unused=True)
    torch.cuda.synchronize()
    rec[f"{key}_first_call_s"] = round(time.time() - t0, 2)  # JIT compile + autotune
    outs = tuple(o.detach() for o in outs)

    def fwd():
        fn(*plain)

    def fwd_bwd():
        torch.autograd.grad(_tup(fn(*leaves)), leaves, gouts, allow_unused=True)

    rec[f"{key}_ms_fwd"] = bench(fwd, rep)
    rec[f"{key}_ms_fwd_bwd"] = bench(fwd_bwd, rep)
    if graphs:
        try:
            rec[f"{key}_ms_fwd_graph"] = graph_bench(fwd, rep)
            rec[f"{key}_ms_fwd_bwd_graph"] = graph_bench(fwd_bwd, rep)
        except Exception:
            rec[f"{key}_graph_error"] = log_err(f"{label} graph")[-600:]
    return outs, grads


def rel_errs(outs, refs):
    """Per-output rel err of outs against refs, reshaped to refs' shapes."""
    from tilekernels.testing import rel_err

    return [None if o is None or r is None else rel_err(o.float().reshape(r.shape), r.float())
            for o, r in zip(outs, refs)]


def compare(vr, o_p, g_p, o_ours, g_ours, refs, grefs=None) -> None:
    """Peer outputs / grads (in our layout) against ours and the float64 reference."""
    if o_ours is not None:
        vr["rel_err_fwd_vs_ours"] = rel_errs(o_p, o_ours)
        vr["rel_err_grads_vs_ours"] = rel_errs(g_p, g_ours)
    if refs is not None:
        vr["rel_err_fwd_vs_ref64"] = rel_errs(o_p, refs)
    if grefs is not None:
        vr["rel_err_grads_vs_ref64"] = rel_errs(g_p, grefs)


def finish_variant(vr, rec) -> None:
    """peer / ours time ratios, and a note when the forwards disagree beyond bf16."""
    for k in ("fwd", "fwd_bwd", "fwd_graph", "fwd_bwd_graph"):
        if f"peer_ms_{k}" in vr and f"ours_ms_{k}" in rec:
            vr[f"ratio_peer_over_ours_{k}"] = vr[f"peer_ms_{k}"] / rec[f"ours_ms_{k}"]
    big = [e for e in vr.get("rel_err_fwd_vs_ours", []) if e is not None and e > 1e-2]
    if big:
        vr["note"] = "forward differs from ours by > 1e-2: see 'semantics' and rel_err_fwd_vs_ref64"


def run_ours(P, op, rec, a, ref64):
    """Time our side of a case and take the float64 references (ref64() -> (outputs,
    grads or None)); returns (our outputs, our grads, refs, grad refs), None where it failed."""
    try:
        o_ours, g_ours = run_side(P.ours, P.ins, P.gouts, rec, "ours", a.rep, a.graphs, f"{op} ours")
    except Exception:
        rec["ours_error"] = log_err(f"{op} ours")[-800:]
        o_ours = g_ours = None
    refs = grefs = None
    if a.ref64:
        try:
            with torch.no_grad():
                refs, grefs = ref64()
            torch.cuda.empty_cache()
            if o_ours is not None:
                rec["ours_rel_err_vs_ref64"] = rel_errs(o_ours, refs)
                if grefs is not None:
                    rec["ours_rel_err_grads_vs_ref64"] = rel_errs(g_ours, grefs)
        except Exception:
            log_err(f"{op} ref64")
    return o_ours, g_ours, refs, grefs


def run_variants(P, op, rec, a, ours, peer_side, on_error=None) -> None:
    """Every requested peer variant of a case: peer_side(fn, vr, label) times it and returns
    its (outputs, grads) in our layout; compared with ours and the references, recorded in
    rec["variants"]. on_error(fn, vr, label), if given, runs after a failure."""
    o_ours, g_ours, refs, grefs = ours
    for v in a.variants.split(","):
        fn = P.peer.get(v)
        if fn is None:
            continue
        vr, label = {}, f"{op} peer {v}"
        try:
            o_p, g_p = peer_side(fn, vr, label)
            compare(vr, o_p, g_p, o_ours, g_ours, refs, grefs)
            del o_p, g_p
        except Exception:
            vr["error"] = log_err(label)[-800:]
            if on_error is not None:
                on_error(fn, vr, label)
        finish_variant(vr, rec)
        rec["variants"][v] = vr
        print(json.dumps({"op": op, "variant": v, **vr}, default=str), flush=True)


def run_op(op, fm, a):
    P = Case(op, fm, getattr(torch, a.h_dtype))
    rec = {"op": op, "shape": {"s": S, "b": B, "T": T, "n": n, "C": C, "K": K, "N": N},
           "params": {"iters": ITERS, "eps": EPS} if op == "mhc_sinkhorn" else {"eps": EPS},
           "dtypes": [str(t.dtype) for t in P.ins], "semantics": SEMANTICS[op], "variants": {}}
    ours = run_ours(P, op, rec, a, lambda f=P.ref64: (f(), None))

    def peer_side(fn, vr, label):
        o_p, g_p = run_side(fn, P.ins, P.gouts, vr, "peer", a.rep, a.graphs, label)
        vr["out_dtypes"] = [str(o.dtype) for o in o_p]
        return o_p, g_p

    run_variants(P, op, rec, a, ours, peer_side)
    P = ours = None  # free the case before empty_cache (the closures hold the same cells)
    torch.cuda.empty_cache()
    return rec


# ------------------------------------------------------------------ main
def env_info():
    p = torch.cuda.get_device_properties(0)
    env = {"device": p.name, "sm": f"{p.major}{p.minor}", "sms": p.multi_processor_count, "torch": torch.__version__}
    for mod in ("triton", "cuda.tile"):
        try:
            env[mod] = __import__(mod, fromlist=["x"]).__version__
        except Exception as e:  # noqa: BLE001
            env[mod] = f"unavailable: {e}"
    return env


def print_table():
    cols = ("op", "variant", "peer fwd", "peer f+b", "ours fwd", "ours f+b", "x fwd", "x f+b", "x f+b graph",
            "relerr fwd")
    print("\n%-16s %-9s %9s %9s %9s %9s %7s %7s %11s %10s" % cols)
    nan = float("nan")
    for r in RESULTS["records"]:
        for v, vr in r["variants"].items():
            errs = [e for e in vr.get("rel_err_fwd_vs_ours", []) if e is not None]
            print("%-16s %-9s %9.3f %9.3f %9.3f %9.3f %7.2f %7.2f %11.2f %10.2e" % (
                r["op"], v, vr.get("peer_ms_fwd", nan), vr.get("peer_ms_fwd_bwd", nan), r.get("ours_ms_fwd", nan),
                r.get("ours_ms_fwd_bwd", nan), vr.get("ratio_peer_over_ours_fwd", nan),
                vr.get("ratio_peer_over_ours_fwd_bwd", nan), vr.get("ratio_peer_over_ours_fwd_bwd_graph", nan),
                max(errs) if errs else nan))
    print("ms are do_bench medians; x = peer / ours (> 1: ours faster); relerr = max over outputs, peer vs ours. "
          f"errors: {len(RESULTS['errors'])}")


def run_ops(ops, run_one, path, t_start, best_configs=None) -> None:
    """Run each op (its own try/except), saving RESULTS to ``path`` after every op
    (shared with peer_te_mhc.py)."""
    torch.manual_seed(0)
    for op in ops:
        t0 = time.time()
        try:
            rec = run_one(op)
            rec["wall_s"] = round(time.time() - t0, 1)
            RESULTS["records"].append(rec)
        except Exception:
            log_err(f"{op} setup")
        if best_configs is not None:
            RESULTS["peer_triton_best_configs"] = best_configs()
        RESULTS["wall_s"] = round(time.time() - t_start, 1)
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ops", default="mhc_sinkhorn,mhc_h_aggregate,mhc_h_post_bda,mhc_proj_rms")
    ap.add_argument("--variants", default="dispatch,cutile", help="peer paths: dispatch (public API), cutile")
    ap.add_argument("--h-dtype", default="bfloat16", choices=("bfloat16", "float32"),
                    help="dtype of h_pre/h_post/h_res (bf16: what Megatron feeds them, its proj_rms returns x.dtype)")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--no-graphs", dest="graphs", action="store_false")
    ap.add_argument("--no-ref64", dest="ref64", action="store_false")
    ap.add_argument("--quick", action="store_true",
                    help="prune the peer's Triton autotune to its num_warps=4 configs (faster, not its full search)")
    ap.add_argument("--check-import", action="store_true", help="import the peer (with the stubs) and exit")
    a = ap.parse_args()
    t_start = time.time()
    fm, tm, info = import_peer(a.quick)
    RESULTS["peer"] = info
    if a.check_import:
        print(json.dumps({k: v for k, v in info.items() if k != "source"}, indent=1))
        return
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "peer_megatron_mhc.json")
    RESULTS["env"] = env_info()
    RESULTS["args"] = vars(a)
    print(json.dumps(RESULTS["env"]), flush=True)
    best = (lambda: {k: str(getattr(getattr(tm, k), "best_config", None)) for k in _TRITON_KERNELS}) \
        if tm is not None else None
    run_ops(a.ops.split(","), lambda op: run_op(op, fm, a), path, t_start, best)
    print_table()
    print(f"wall {RESULTS['wall_s']} s; JSON: {path}")


if __name__ == "__main__":
    main()
