#!/usr/bin/env python3
"""Same-run GPU timing of the public peer "Transformer Engine's Triton mHC kernels" next to ours.

The peer (transformer_engine/pytorch/triton/mhc.py + transformer_engine/common/triton/mhc.py of
NVIDIA/TransformerEngine) is NOT part of this repository: it lives, verbatim and git-ignored, in
.peers/te/ (provenance in .peers/te/SOURCE.txt), next to empty package __init__ stubs and a
raising stub of the one C++-backed name it imports. Nothing of it is copied here: this file only
calls its public API (mhc_fused_sinkhorn, mhc_fused_aggregate, mhc_fused_expand_combine).

Ops (T = s*b = 8192*4 = 32768 tokens, n = 4, C = 7168, bf16 activations), as in
peer_megatron_mhc.py (whose timing / table helpers and headline shapes this driver reuses):
  mhc_sinkhorn (20 iters, eps 1e-6), mhc_h_aggregate, mhc_h_post_bda (bias given).
  No proj_rms: TE's mhc_fused_projection computes mean(x^2), not r (see NOT_MEASURED).
TE keeps the stream dim last: x / residual / out [s, b, C, n] where ours are [T, n, C], and its
H_res of expand_combine is the transpose of OPS.md's h_res. The peer's inputs are made from the
same random tensors as ours (views where the layout agrees, contiguous transposed copies where
not) OUTSIDE the timed region; its outputs and grads are mapped back to our layout and checked
against ours and against the float64 reference (forward and grads). fwd and fwd+bwd are timed
with triton.testing.do_bench (median), eagerly and replayed from a CUDA graph. Prints a table;
writes JSON to --out.

Peer variants: "triton" = the public wrappers (sinkhorn with its default recompute_hist=True);
"hist" = sinkhorn only, recompute_hist=False (forward stores the f/g history for the backward).

On the GPU host, from the repository root (the run must carry .gpu-cutile and .peers):

    source .gpu-cutile/env.sh
    python3 benchmarks/peer_te_mhc.py --quick --out "$OUT"

On any machine (no GPU, no Triton needed): python3 benchmarks/peer_te_mhc.py --check-import
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TE_DIR = os.path.join(ROOT, ".peers", "te")
sys.path[:0] = [ROOT, TE_DIR, HERE]

import torch  # noqa: E402

import peer_megatron_mhc as pm  # noqa: E402  shared shapes, timing, table, RESULTS
from peer_megatron_mhc import B, C, EPS, F32, ITERS, S, T, n, rnd  # noqa: E402

RESULTS = pm.RESULTS  # pm.log_err / pm.print_table / pm.run_side record into this
log_err, rel_errs = pm.log_err, pm.rel_errs

PEER_MODULE = "transformer_engine.pytorch.triton.mhc"
KERNEL_MODULE = "transformer_engine.common.triton.mhc"
# sha256 of the verbatim copies (as recorded in .peers/te/SOURCE.txt)
PEER_FILES = {
    "transformer_engine/pytorch/triton/mhc.py": "36fa64e94a9e56ef4d838040e90dc7142689060abf2da051ab84fbd571caca5a",
    "transformer_engine/common/triton/mhc.py": "4cfef9832416e77896e8389577943120f899726b2297e11ed195dd54328d2af9",
}
ENTRY_POINTS = ("mhc_fused_sinkhorn", "mhc_fused_aggregate", "mhc_fused_expand_combine")
# The autotuned kernels the measured ops launch. The aggregate / expand_combine kernels have no
# loop, so num_stages (software pipelining of loops) should not change their code: --quick keeps
# one num_stages per (block sizes, num_warps) for those; the sinkhorn kernels keep all configs.
SINKHORN_KERNELS = ("_mhc_sinkhorn_fwd_fused_recompute", "_mhc_sinkhorn_bwd_fused_recompute",
                    "_mhc_sinkhorn_fwd_fused", "_mhc_sinkhorn_bwd_fused")
LOOP_FREE_KERNELS = ("_mhc_aggregate_fwd", "_mhc_aggregate_bwd",
                     "_mhc_expand_combine_with_bias_fwd", "_mhc_expand_combine_with_bias_bwd")

# What differs between the peer and OPS.md (from reading the peer's code; the measured rel
# errors say how much it matters).
SEMANTICS = {
    "mhc_sinkhorn": "Log-domain Sinkhorn: from f = g = 0, iters x [f = -logsumexp_j(l + g) (rows), "
                    "g = -logsumexp_i(l + f) (columns)], out = exp(f + l + g): the same row-then-column "
                    "normalisation and [.., n, n] convention as OPS.md, but with eps = 0 (TE has no eps; OPS.md "
                    "adds eps = 1e-6 to every row/column sum) and no explicit row-max shift (logsumexp is "
                    "shift-invariant): O(eps) differences in out and dlogits. fp32 math, output in the input's "
                    "dtype (fp32 here, as ours). Backward = exact gradient of its eps-free iteration, replaying "
                    "the f/g history through a global (iters+1) x [s, b, n] x 2 fp32 scratch: recomputed by a "
                    "second forward pass inside the backward kernel (recompute_hist=True, variant 'triton') or "
                    "stored by the forward (variant 'hist'). n == 4 only (asserted).",
    "mhc_h_aggregate": "Same math. TE is stream-last: x [s, b, C, n] (ours [T, n, C]; the driver passes a "
                       "contiguous transposed copy made outside the timed region and transposes dx back), "
                       "h_pre [s, b, n] (a view of ours). Forward: fp32 FMA accumulation, output x.dtype. "
                       "Backward: dx = dout * h_pre in the promoted dtype, stored in x.dtype; dh_pre by tl.dot "
                       "(fp32 accumulate) and fp32 atomics across C blocks (non-deterministic), cast to "
                       "h_pre.dtype. n == 4 only.",
    "mhc_h_post_bda": "TE's mhc_fused_expand_combine(f, bias, H_post, x, H_res, n): out[.., c, j] = "
                      "sum_i H_res[i, j] x[.., c, i] + H_post[j] (f[c] + bias[c]), stream-last x/out/dout "
                      "[s, b, C, n]. Its H_res is the TRANSPOSE of OPS.md's h_res (ours: out_i = sum_j "
                      "h_res[i, j] residual_j): the driver passes h_res^T and residual/dout as contiguous "
                      "transposed copies made outside the timed region, and maps out, dH_res, dresidual back. "
                      "fp32 accumulation (bias*H_post and f*H_post as two FMAs: x + bias is never rounded, as "
                      "OPS.md); output in residual's dtype (as OPS.md); dbias = fp32 atomic sum over T of the "
                      "unrounded df, cast to bias.dtype (as OPS.md); dH_post, dH_res: fp32 atomics (non-"
                      "deterministic) cast to the h dtype. n == 4 only.",
}
NOT_MEASURED = {
    "mhc_proj_rms": "TE's mhc_fused_projection is not the same op: it returns H = x phi^T padded to [M, 32] in "
                    "x.dtype (bf16) and ms = mean(x^2) (fp32), not r = 1/(||x||/sqrt(K) + eps); its "
                    "mhc_fused_scale then normalises by 1/sqrt(ms + fp32 eps) (eps inside the root). Its "
                    "backward needs TE's C++ general_gemm (stubbed here).",
    "mhc_pre": "No fused pre in TE: mhc_fused_projection + mhc_fused_scale (alpha/beta/sigmoid) + "
               "mhc_fused_sinkhorn + mhc_fused_aggregate are separate launches with bf16 intermediates.",
}
H_DTYPE_NOTE = ("TE's own pipeline feeds bf16 H_pre/H_post/H_res: mhc_fused_projection returns H in x.dtype "
                "and mhc_fused_scale keeps H's dtype (as non-contiguous slices of an [M, 32] buffer that "
                "TE's wrappers then copy with .contiguous(); here they are passed contiguous). Sinkhorn logits "
                "are fp32 for both sides (OPS.md's dtype; TE computes in fp32 and returns the input dtype).")


# ------------------------------------------------------------------ layouts
def to_te_streams(t):
    """Ours [T, n, C] -> TE's stream-last [s, b, C, n] (a contiguous copy)."""
    return t.view(S, B, n, C).transpose(2, 3).contiguous()


def from_te_streams(t):
    """TE's [s, b, C, n] -> ours [T, n, C]."""
    return t.transpose(-1, -2).reshape(T, n, C)


def to_te_hres(h):
    """OPS.md h_res [T, n, n] (out_i = sum_j h[i, j] res_j) -> TE's H_res [s, b, n, n]
    (out_j = sum_i H[i, j] x_i): the transpose, as a contiguous copy."""
    return h.transpose(-1, -2).contiguous().view(S, B, n, n)


def from_te_hres(h):
    return h.reshape(T, n, n).transpose(-1, -2)


# ------------------------------------------------------------------ peer
def _prune_stages(configs):
    """One config per (kwargs, num_warps): the smallest num_stages."""
    keep = {}
    for c in configs:
        k = (tuple(sorted(c.kwargs.items())), c.num_warps)
        if k not in keep or c.num_stages < keep[k].num_stages:
            keep[k] = c
    return list(keep.values())


def import_peer(quick: bool):
    """Import the verbatim peer (needs torch + triton); with quick, prune loop-free kernels' configs."""
    tm = importlib.import_module(PEER_MODULE)
    km = importlib.import_module(KERNEL_MODULE)
    configs = {}
    for name in SINKHORN_KERNELS + LOOP_FREE_KERNELS:
        at = getattr(km, name)
        full = len(at.configs)
        if quick and name in LOOP_FREE_KERNELS:
            at.configs = _prune_stages(at.configs)
        configs[name] = f"{len(at.configs)} of {full}"
    info = {"file": tm.__file__, "kernels_file": km.__file__, "quick_triton_autotune": quick,
            "autotune_configs": configs,
            "NVTE_DISABLE_TRITON_AUTOTUNING": os.environ.get("NVTE_DISABLE_TRITON_AUTOTUNING", "0")}
    src = os.path.join(TE_DIR, "SOURCE.txt")
    if os.path.exists(src):
        info["source"] = open(src).read()
    return tm, km, info


def _defined_names(path):
    tree = ast.parse(open(path).read())
    return {nd.name for nd in tree.body if isinstance(nd, (ast.FunctionDef, ast.ClassDef))} | {
        t.id for nd in tree.body if isinstance(nd, ast.Assign) for t in nd.targets if isinstance(t, ast.Name)}


def check_import(quick: bool) -> int:
    """Static checks that need no Triton (files, hashes, module resolution, imported names), then the
    real import. Returns the exit status: 0 when only a missing Triton stops the import."""
    info, ok = {"te_dir": TE_DIR, "files": {}, "resolves": {}, "names": {}}, True
    for rel, want in PEER_FILES.items():
        p = os.path.join(TE_DIR, rel)
        got = hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.exists(p) else None
        info["files"][rel] = "sha256 ok" if got == want else f"MISMATCH: {got or 'missing'} (want {want})"
        ok &= got == want
    try:
        for rel in PEER_FILES:  # every `from transformer_engine.X import a, b` must resolve to a defined name
            for nd in ast.parse(open(os.path.join(TE_DIR, rel)).read()).body:
                if isinstance(nd, ast.ImportFrom) and (nd.module or "").startswith("transformer_engine"):
                    spec = importlib.util.find_spec(nd.module)  # imports only the (empty) parent packages
                    origin = spec.origin if spec else None
                    missing = sorted({a.name for a in nd.names} - _defined_names(origin)) if origin else ["<module>"]
                    info["resolves"][nd.module] = origin
                    info["names"][nd.module] = f"missing {missing}" if missing else f"{len(nd.names)} names ok"
                    ok &= not missing
        spec = importlib.util.find_spec(PEER_MODULE)
        info["resolves"][PEER_MODULE] = spec.origin if spec else None
        missing = sorted(set(ENTRY_POINTS) - _defined_names(spec.origin)) if spec else list(ENTRY_POINTS)
        info["names"]["entry points"] = f"missing {missing}" if missing else ", ".join(ENTRY_POINTS)
        ok &= not missing and spec.origin.startswith(TE_DIR)
    except Exception as e:  # noqa: BLE001
        info["static_check_error"] = repr(e)
        ok = False
    try:
        info.update({k: v for k, v in import_peer(quick)[2].items() if k != "source"})
        info["import"] = "ok"
    except ModuleNotFoundError as e:
        if e.name == "triton":
            info["import"] = ("not attempted past `import triton`: Triton is not installed on this machine "
                              "(expected without the GPU toolchain); the static checks above are the result")
        else:
            info["import"], ok = f"FAILED: {e!r}", False
    except Exception as e:  # noqa: BLE001
        info["import"], ok = f"FAILED: {e!r}", False
    info["status"] = "ok" if ok else "FAILED"
    print(json.dumps(info, indent=1))
    return 0 if ok else 1


# ------------------------------------------------------------------ problems
class Case:
    """One op: our inputs/params and callable, the peer's inputs (TE layout, made once from the same
    tensors), its callables, the maps of its outputs/grads back to ours, and the float64 reference."""

    def __init__(self, op, tm, h_dtype):
        import registry
        from tilekernels.mhc import reference as ref

        self.op = op
        f = registry.get(op)
        if op == "mhc_sinkhorn":
            lg, g = rnd(T, n, n, dtype=F32, scale=2.0), rnd(T, n, n, dtype=F32)
            self.ins, self.gouts = [lg], (g,)
            self.ours = lambda lg: f(lg, iters=ITERS, eps=EPS)
            self.te_ins, self.te_gouts = [lg.view(S, B, n, n)], (g.view(S, B, n, n),)
            self.peer = {"triton": lambda h: tm.mhc_fused_sinkhorn(h, n, True, ITERS),
                         "hist": lambda h: tm.mhc_fused_sinkhorn(h, n, False, ITERS)}
            self.outs_back = lambda o: (o[0].reshape(T, n, n),)
            self.grads_back = lambda d: (d[0].reshape(T, n, n),)
            self.call = "mhc_fused_sinkhorn(H_res, n=4, recompute_hist=True ('triton') | False ('hist'), iters=20)"
            self.layout = {"H_res": "[s, b, n, n] fp32, a view of ours"}

            def ref64():
                l64, g64 = lg.double(), g.double()
                return (ref.sinkhorn(l64, ITERS, EPS),), (ref.sinkhorn_bwd(g64, l64, ITERS, EPS),)
        elif op == "mhc_h_aggregate":
            x, h, g = rnd(T, n, C), rnd(T, n, dtype=h_dtype), rnd(T, C)
            self.ins, self.gouts = [x, h], (g,)
            self.ours = lambda x, h: f(x, h)
            self.te_ins, self.te_gouts = [to_te_streams(x), h.view(S, B, n)], (g.view(S, B, C),)
            self.peer = {"triton": lambda x, h: tm.mhc_fused_aggregate(x, h, n)}
            self.outs_back = lambda o: (o[0].reshape(T, C),)
            self.grads_back = lambda d: (from_te_streams(d[0]), d[1].reshape(T, n))
            self.call = "mhc_fused_aggregate(x, H_pre, n=4, use_tf32=True)"
            self.layout = {"x": "[s, b, C, n] bf16, transposed copy of ours", "H_pre": "[s, b, n], view of ours",
                           "out": "[s, b, C]"}

            def ref64():
                x64, h64 = x.double(), h.double()
                return (ref.h_aggregate(x64, h64),), ref.h_aggregate_bwd(g.double(), x64, h64)
        elif op == "mhc_h_post_bda":
            hr, hp = rnd(T, n, n, dtype=h_dtype, scale=0.5), rnd(T, n, dtype=h_dtype)
            res, x, b, g = rnd(T, n, C), rnd(T, C), rnd(C), rnd(T, n, C)
            self.ins, self.gouts = [hr, res, hp, x, b], (g,)
            self.ours = lambda hr, res, hp, x, b: f(hr, res, hp, x, b)
            # TE's argument order: (f, bias, H_post, x, H_res)
            self.te_ins = [x.view(S, B, C), b, hp.view(S, B, n), to_te_streams(res), to_te_hres(hr)]
            self.te_gouts = (to_te_streams(g),)
            self.peer = {"triton": lambda f_, b_, hp_, xs, hr_: tm.mhc_fused_expand_combine(f_, b_, hp_, xs, hr_, n)}
            self.outs_back = lambda o: (from_te_streams(o[0]),)
            self.grads_back = lambda d: (from_te_hres(d[4]), from_te_streams(d[3]), d[2].reshape(T, n),
                                         d[0].reshape(T, C), d[1])
            self.call = "mhc_fused_expand_combine(f=x, bias, H_post, x=residual, H_res=h_res^T, n=4, use_tf32=True)"
            self.layout = {"f": "[s, b, C], view of our x", "bias": "[C]", "H_post": "[s, b, n], view of ours",
                           "x": "[s, b, C, n], transposed copy of our residual",
                           "H_res": "[s, b, n, n], transposed copy of our h_res", "out": "[s, b, C, n]"}

            def ref64():
                a64 = [t.double() for t in (hr, res, hp, x, b)]
                return (ref.h_post_bda(*a64),), ref.h_post_bda_bwd(g.double(), *a64)
        else:
            raise ValueError(f"{op}: not measured against TE ({NOT_MEASURED.get(op, 'unknown op')})")
        self.ref64 = ref64


def peer_fwd_only(fn, P, vr, a, o_ours, refs):
    """The peer's forward alone (no autograd), checked and timed eagerly."""
    plain = [t.detach() for t in P.te_ins]
    with torch.no_grad():
        outs = P.outs_back(pm._tup(fn(*plain)))
        vr["peer_ms_fwd"] = pm.bench(lambda: fn(*plain), a.rep)
    vr["fwd_only"] = True
    if o_ours is not None:
        vr["rel_err_fwd_vs_ours"] = rel_errs(outs, o_ours)
    if refs is not None:
        vr["rel_err_fwd_vs_ref64"] = rel_errs(outs, refs)


def run_op(op, tm, a):
    P = Case(op, tm, getattr(torch, a.h_dtype))
    rec = {"op": op, "shape": {"s": S, "b": B, "T": T, "n": n, "C": C},
           "params": {"iters": ITERS, "eps": EPS} if op == "mhc_sinkhorn" else {},
           "dtypes": [str(t.dtype) for t in P.ins], "peer_call": P.call, "peer_layout": P.layout,
           "semantics": SEMANTICS[op], "variants": {}}
    ours = pm.run_ours(P, op, rec, a, P.ref64)

    def peer_side(fn, vr, label):
        o_p, g_p = pm.run_side(fn, P.te_ins, P.te_gouts, vr, "peer", a.rep, a.graphs, label)
        vr["out_dtypes"] = [str(o.dtype) for o in o_p]
        vr["grad_dtypes"] = [None if d is None else str(d.dtype) for d in g_p]
        return P.outs_back(o_p), P.grads_back(g_p)  # to our layout, outside any timing

    def fwd_only(fn, vr, label):  # keep the forward numbers when only the backward (or a graph) fails
        try:
            peer_fwd_only(fn, P, vr, a, ours[0], ours[2])
        except Exception:
            vr["fwd_only_error"] = log_err(f"{label} fwd only")[-800:]

    pm.run_variants(P, op, rec, a, ours, peer_side, fwd_only)
    P = ours = None  # free the case before empty_cache (the closures hold the same cells)
    torch.cuda.empty_cache()
    return rec


# ------------------------------------------------------------------ main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ops", default="mhc_sinkhorn,mhc_h_aggregate,mhc_h_post_bda")
    ap.add_argument("--variants", default="triton,hist",
                    help="peer paths: triton (public wrappers), hist (sinkhorn with recompute_hist=False)")
    ap.add_argument("--h-dtype", default="bfloat16", choices=("bfloat16", "float32"),
                    help="dtype of h_pre/h_post/h_res (bf16: what TE's own projection/scale produce)")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--no-graphs", dest="graphs", action="store_false")
    ap.add_argument("--no-ref64", dest="ref64", action="store_false")
    ap.add_argument("--quick", action="store_true",
                    help="autotune the peer's loop-free aggregate/expand_combine kernels over one num_stages per "
                         "(block, num_warps) (27 of 108, 12 of 48 configs); sinkhorn keeps its full search")
    ap.add_argument("--check-import", action="store_true",
                    help="check the peer files, their imports and entry points (no GPU/Triton needed) and exit")
    a = ap.parse_args()
    if a.check_import:
        sys.exit(check_import(a.quick))
    t_start = time.time()
    tm, km, info = import_peer(a.quick)
    RESULTS["peer"] = {**info, "not_measured": NOT_MEASURED}
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "peer_te_mhc.json")
    RESULTS["env"] = pm.env_info()
    RESULTS["args"] = vars(a)
    RESULTS["h_dtype"], RESULTS["h_dtype_note"] = a.h_dtype, H_DTYPE_NOTE
    print(json.dumps(RESULTS["env"]), flush=True)
    pm.run_ops(a.ops.split(","), lambda op: run_op(op, tm, a), path, t_start,
               lambda: {k: str(getattr(getattr(km, k), "best_config", None))
                        for k in SINKHORN_KERNELS + LOOP_FREE_KERNELS})
    pm.print_table()
    for r in RESULTS["records"]:
        for v, vr in r["variants"].items():
            print(f"{r['op']:16s} {v:7s} grads rel err vs ours {vr.get('rel_err_grads_vs_ours')}; "
                  f"vs ref64 peer {vr.get('rel_err_grads_vs_ref64')} ours {r.get('ours_rel_err_grads_vs_ref64')}")
    print(f"wall {RESULTS['wall_s']} s; JSON: {path}")


if __name__ == "__main__":
    main()
