#!/usr/bin/env python3
"""GPU check + timing of the cuTile mHC kernels (run on the device host).

On the GPU host, from the repository root (as the results in
benchmarks/results/nvidia-h200-mhc-cutile.md were made):

    source .gpu-cutile/env.sh
    python3 -m pytest tests/mhc/test_mhc_cutile_gpu.py -n 12   # correctness (big cases one at a time: tests/conftest.py)
    python3 benchmarks/mhc_cutile_check.py --out DIR --phases env,sweep,compile
    compute-sanitizer --tool memcheck python3 benchmarks/mhc_cutile_check.py --memcheck

Phases: env (device, copy bandwidth, what cuTile's JIT infers about arguments);
time (every kernel at T=32768, n=4, C=7168, bf16 activations, fp32 h, bias
given: triton.testing.do_bench median, GB/s and % of the copy bandwidth, next
to torch eager); sweep (config variants, each checked against the default
config's outputs, then timed); compile (time again, adding torch.compile of the
fp32 torch reference formulas). Bytes are counted by hand (every input read
once, every output written once). Prints a short table; writes JSON to DIR.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "mhc")]

import torch  # noqa: E402

from _gpu import bench, copy_gb_s, device_env, log_error  # noqa: E402

from tilekernels.mhc import cutile_aggregate as agg  # noqa: E402
from tilekernels.mhc import cutile_post_bda as pb  # noqa: E402
from tilekernels.mhc import cutile_pre as pre  # noqa: E402
from tilekernels.mhc import cutile_proj_rms as pr  # noqa: E402
from tilekernels.mhc import cutile_sinkhorn as sk  # noqa: E402
from tilekernels.mhc import reference as ref  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
T, n, C = 32768, 4, 7168
RESULTS: dict = {"records": [], "sweeps": [], "errors": []}




log_err = functools.partial(log_error, RESULTS["errors"], limit=6)


# ------------------------------------------------------------------ problems
def r(*s, dtype=BF, scale=1.0):
    return (torch.randn(*s, device="cuda") * scale).to(dtype)


def e(*s, dtype=BF):
    return torch.empty(*s, dtype=dtype, device="cuda")


class Problem:
    """Inputs/outputs at the headline shape, the launches, the peers, the bytes."""

    def __init__(self, op):
        self.op = op
        K, N = n * C, n * n + 2 * n
        if op == "mhc_h_aggregate":
            x, h = r(T, n, C), r(T, n, dtype=F32)
            out, dout, dx, dh = e(T, C), r(T, C), e(T, n, C), e(T, n, dtype=F32)
            self.fwd = lambda cfg=None: [agg.fwd_launch(x, h, out, cfg)]
            self.bwd = lambda cfg=None: [agg.bwd_launch(dout, x, h, dx, dh, cfg)]
            self.cfg = agg.AggCfg.heuristic(T, n, C)
            self.outs_f, self.outs_b = (out,), (dx, dh)
            self.eager_f = lambda: ref.h_aggregate(x, h)
            self.eager_b = lambda: ref.h_aggregate_bwd(dout, x, h)
            self.bytes_f = 2 * T * n * C + 4 * T * n + 2 * T * C
            self.bytes_b = 2 * T * C + 2 * (2 * T * n * C) + 2 * 4 * T * n
        elif op.startswith("mhc_h_post_bda"):  # "mhc_h_post_bda_bf16h": h_res / h_post in bf16
            hd = BF if op.endswith("bf16h") else F32
            hr, hp = r(T, n, n, dtype=hd, scale=0.5), r(T, n, dtype=hd)
            res, x, b = r(T, n, C), r(T, C), r(C)
            out, dout = e(T, n, C), r(T, n, C)
            g = (e(T, n, n, dtype=F32), e(T, n, C), e(T, n, dtype=F32), e(T, C), e(C))
            self.fwd = lambda cfg=None: pb.fwd_launches(hr, res, hp, x, b, out, cfg)
            self.bwd = lambda cfg=None: pb.bwd_launches(dout, hr, res, hp, x, b, *g, cfg=cfg)
            self.cfg = pb.PostBdaCfg.heuristic(T, n, C)
            self.outs_f, self.outs_b = (out,), g
            self.eager_f = lambda: ref.h_post_bda(hr, res, hp, x, b)
            self.eager_b = lambda: ref.h_post_bda_bwd(dout, hr, res, hp, x, b)
            big, h = 2 * T * n * C, 4 * T * (n * n + n)
            hi = (2 if hd == BF else 4) * T * (n * n + n)                 # h read in its dtype; its grads fp32 (g)
            self.bytes_f = hi + big + 2 * T * C + 2 * C + big
            self.bytes_b = big + hi + big + 2 * T * C + 2 * C + h + big + 2 * T * C + 2 * C
        elif op == "mhc_sinkhorn":
            lg, out, dout, dl = r(T, n, n, dtype=F32, scale=2.0), e(T, n, n, dtype=F32), \
                r(T, n, n, dtype=F32), e(T, n, n, dtype=F32)
            self.fwd = lambda cfg=None: [sk.fwd_launch(lg, out, 20, 1e-6, cfg)]
            self.bwd = lambda cfg=None: [sk.bwd_launch(dout, lg, dl, 20, 1e-6, cfg)]
            self.cfg = sk.SinkhornCfg.heuristic(T, n, 20)
            self.outs_f, self.outs_b = (out,), (dl,)
            self.eager_f = lambda: ref.sinkhorn(lg, 20, 1e-6)
            self.eager_b = lambda: ref.sinkhorn_bwd(dout, lg, 20, 1e-6)
            self.bytes_f, self.bytes_b = 2 * 4 * T * n * n, 3 * 4 * T * n * n
        elif op == "mhc_proj_rms":
            x, w = r(T, K), r(N, K, scale=0.05)
            proj, rr, dproj, dr = e(T, N, dtype=F32), e(T, dtype=F32), r(T, N, dtype=F32), r(T, dtype=F32)
            dx, dw = e(T, K), e(N, K)
            self.fwd = lambda cfg=None: [pr.fwd_launch(x, w, proj, rr, 1e-6, cfg)]
            self.bwd = lambda cfg=None: pr.bwd_launches(dproj, dr, x, w, rr, dx, dw, 1e-6, cfg)
            self.cfg = pr.ProjRmsCfg.heuristic(T, N, K)
            self.outs_f, self.outs_b = (proj, rr), (dx, dw)
            self.eager_f = lambda: ref.proj_rms(x, w, 1e-6)
            self.eager_b = lambda: ref.proj_rms_bwd(dproj, dr, x, w, rr, 1e-6)
            self.bytes_f = 2 * T * K + 2 * N * K + 4 * T * N + 4 * T
            self.bytes_b = 4 * T * N + 4 * T + 2 * T * K + 2 * N * K + 4 * T + 2 * T * K + 2 * N * K
        elif op == "mhc_pre":
            self._pre(K, N)

    def _pre(self, K, N):
        """mhc_pre, and its parts run one after another (the cuTile proj_rms, sinkhorn and
        h_aggregate kernels with the mix and its backward in torch) as the peer "parts"."""
        x, w, b = r(T, n, C), r(N, K, scale=K ** -0.5), r(N, dtype=F32)
        prm = (0.7, 1.3, 0.4, 20, 1e-6, 1e-6)
        outs = (e(T, C), e(T, n, dtype=F32), e(T, n, n, dtype=F32), e(T, N, dtype=F32), e(T, dtype=F32))
        dli, dhp, dhr = r(T, C), r(T, n, dtype=F32), r(T, n, n, dtype=F32)
        g = (e(T, n, C), e(N, K), e(N, dtype=F32))
        self.fwd = lambda cfg=None: pre.fwd_launches(x, w, b, *outs, *prm, cfg=cfg)
        self.bwd = lambda cfg=None: pre.bwd_launches(dli, dhp, dhr, x, w, b, outs[3], outs[4], *g, *prm,
                                                     cfg=cfg)
        self.cfg = pre.PreCfg.heuristic(T, n, C, 20)
        self.outs_f, self.outs_b = outs, g
        x2 = x.view(T, K)
        proj, rr, hres, li = e(T, N, dtype=F32), e(T, dtype=F32), e(T, n, n, dtype=F32), e(T, C)
        dxa, dha, dres, dxp, dw = e(T, n, C), e(T, n, dtype=F32), e(T, n, n, dtype=F32), e(T, K), e(N, K)
        st = {}

        def parts_f():
            run([pr.fwd_launch(x2, w, proj, rr, 1e-6)])
            p_, q_, s_, _ = ref._pre_mix(proj, rr, b, n, prm[:3])
            st["s_pre"], st["s_post"], st["res"] = torch.sigmoid(p_), torch.sigmoid(q_), s_.contiguous()
            run([sk.fwd_launch(st["res"], hres, 20, 1e-6), agg.fwd_launch(x, st["s_pre"], li)])
            return li, 2 * st["s_post"], hres

        def parts_b():
            sp, sq = st["s_pre"], st["s_post"]
            run([agg.bwd_launch(dli, x, sp, dxa, dha), sk.bwd_launch(dhr, st["res"], dres, 20, 1e-6)])
            dh = torch.cat([dha * sp * (1 - sp), dhp * 2 * sq * (1 - sq), dres.view(T, n * n)], dim=1)
            alpha = ref.pre_alpha(n, *prm[:3], dtype=F32, device="cuda")
            run(pr.bwd_launches(dh * rr[:, None] * alpha, (dh * proj * alpha).sum(1), x2, w, rr, dxp, dw, 1e-6))
            return dxa + dxp.view(T, n, C), dw, dh.sum(0)

        self.parts_f, self.parts_b = parts_f, parts_b
        self.eager_f = lambda: ref.mhc_pre(x, w, b, *prm)
        self.eager_b = lambda: ref.mhc_pre_bwd(dli, dhp, dhr, x, w, b, outs[3], outs[4], *prm)
        self.bytes_f = 2 * T * K + 2 * N * K + 4 * N + 2 * T * C + 4 * T * n + 4 * T * n * n + 4 * T * N + 4 * T
        self.bytes_b = 2 * T * C + 4 * T * n + 4 * T * n * n + 2 * T * K + 2 * N * K + 4 * N + 4 * T * N + 4 * T \
            + 2 * T * K + 2 * N * K + 4 * N


def run(launches):
    for ln in launches:
        ln.run()


# ------------------------------------------------------------------ phases
def phase_env(copy_bw_holder):
    env = device_env()
    env["copy_gb_s"] = copy_gb_s()
    copy_bw_holder.append(env["copy_gb_s"])
    try:  # what cuTile's JIT assumes about real arguments
        from cuda.tile.compilation import CallingConvention, KernelSignature
        for Tq, Cq in ((1000, 7168), (1003, 100)):
            x, h, o = r(Tq, n, Cq), r(Tq, n, dtype=F32), e(Tq, Cq)
            ln = agg.fwd_launch(x, h, o)
            sig = KernelSignature.from_kernel_args(ln.kernel, ln.args, CallingConvention.cutile_python_v1())
            env[f"jit_signature_T{Tq}_C{Cq}"] = repr(sig.parameters[0])
    except Exception:
        log_err("signature")
    RESULTS["env"] = env
    print(json.dumps(env, indent=1), flush=True)


def _peer(fn, compiled):
    if not compiled:
        return fn
    return torch.compile(fn)


def phase_time(ops, copy_bw, peers):
    for op in ops:
        try:
            P = Problem(op)
            f, b = P.fwd(), P.bwd()
            run(f), run(b)
            torch.cuda.synchronize()
            tf, tb = bench(lambda: run(f)), bench(lambda: run(b))
            tfb = bench(lambda: (run(f), run(b)))
            # each launch alone (which kernel of a pass the time goes to)
            per = {f"{pas}[{i}] {ln.kernel._pyfunc.__name__}": bench(ln.run, rep=50)
                   for pas, lst in (("fwd", f), ("bwd", b)) for i, ln in enumerate(lst)}
            rec = {"op": op, "backend": "cutile", "device": RESULTS["env"]["device"], "cfg": repr(P.cfg),
                   "shape": {"T": T, "n": n, "C": C}, "ms_fwd": tf, "ms_bwd": tb, "ms_fwd_bwd": tfb,
                   "bytes_fwd": P.bytes_f, "bytes_bwd": P.bytes_b, "ms_per_launch": per}
            tot = P.bytes_f + P.bytes_b
            rec["gb_s_fwd_bwd"] = tot / tfb / 1e6
            rec["pct_of_copy"] = 100 * rec["gb_s_fwd_bwd"] / copy_bw
            rec["gb_s_fwd"], rec["gb_s_bwd"] = P.bytes_f / tf / 1e6, P.bytes_b / tb / 1e6
            if op == "mhc_sinkhorn":  # launch-bound: also time a CUDA graph of fwd+bwd
                try:
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        run(f), run(b)
                    torch.cuda.current_stream().wait_stream(s)
                    gph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(gph):
                        run(f), run(b)
                    rec["ms_fwd_bwd_graph"] = bench(gph.replay)
                except Exception:
                    log_err("sinkhorn graph")
            for pname in peers + (["parts"] if hasattr(P, "parts_f") else []):
                try:
                    if pname == "parts":
                        ef, eb = P.parts_f, P.parts_b
                    else:
                        ef, eb = _peer(P.eager_f, pname == "compile"), _peer(P.eager_b, pname == "compile")
                    ef(), eb()
                    rec[f"{pname}_ms_fwd"] = bench(ef, rep=100)
                    rec[f"{pname}_ms_fwd_bwd"] = bench(lambda: (ef(), eb()), rep=100)
                    rec[f"ratio_{pname}"] = rec[f"{pname}_ms_fwd_bwd"] / tfb
                except Exception:
                    log_err(f"{op} peer {pname}")
            RESULTS["records"] = [x for x in RESULTS["records"] if x["op"] != op] + [rec]
            print(json.dumps(rec), flush=True)
            del P
            torch.cuda.empty_cache()
        except Exception:
            log_err(f"time {op}")


# (pass, config fields to change) tried at the headline shape next to the heuristic
# defaults. Earlier rounds' variants and outcomes: benchmarks/results/nvidia-h200-mhc-cutile.md
SWEEPS = {
    "mhc_h_aggregate": [("fwd", dict(OCC=4)), ("bwd", dict(OCC_B=2))],
    "mhc_h_post_bda_bf16h": [("fwd", dict(H32=False)), ("bwd", dict(ONE=False, TT_D=4, G=64, H32=False))],
    "mhc_sinkhorn": [("fwd", dict(APPROX=0)), ("bwd", dict(PF=0))],
    # at dc465c5 / af74025 (h200-mhc-sweep-reductions-dc465c5.txt, h200-mhc-sweep-af74025.txt):
    # TR 1024 = 2048 > 512 > 256 > 128, dbias TB=256 x RB=16 the best, no PDL +6 us
    "mhc_h_post_bda": [("bwd", dict(TR=512)), ("bwd", dict(PDL=False))],
    # x load latency hints, TMA off, worker-warp hints, one-step-ahead loads: all slower
    # (b5330c8, af74025, 1e265ce; their code is removed). DWT at TK 128 the default since 17b371f
    "mhc_proj_rms": [("bwd", dict(DWT=False, TK_BWD=256)), ("bwd", dict(GM=10)), ("bwd", dict(OCC_B=3)),
                     ("fwd", dict(TM_F=64))],
    # session 43: the aggregate's token tiles last to first (REV fwd: x's last rows, which the projection pass read
    # last, still in L2; REV_B bwd: the dh_pre pass ends on x's first rows, where the dx pass's first wave starts)
    "mhc_pre": [("bwd", dict(pr=dict(DWT=True, TK_BWD=128))), ("fwd", dict(agg=dict(REV=True))),
                ("bwd", dict(agg=dict(REV_B=True)))],
}


def phase_sweep(ops, copy_bw, deadline):
    for op in ops:
        try:
            P = Problem(op)
        except Exception:
            log_err(f"sweep setup {op}")
            continue
        base = {}
        for pas in ("fwd", "bwd"):
            lst0 = (P.fwd if pas == "fwd" else P.bwd)()
            run(lst0)
            torch.cuda.synchronize()
            base[pas] = [t.clone() for t in (P.outs_f if pas == "fwd" else P.outs_b)]
            base[pas + "_ms"] = bench(lambda: run(lst0), rep=100)
            if len(lst0) > 1:  # each launch of the default on its own
                split = {"op": op, "pass": pas, "split_ms": [
                    (ln.kernel._pyfunc.__name__, bench(ln.run, rep=100)) for ln in lst0]}
                RESULTS["sweeps"].append(split)
                print(json.dumps(split), flush=True)
        for pas, kw in SWEEPS.get(op, []):
            if time.time() > deadline:
                print("sweep: out of time", flush=True)
                return
            rec = {"op": op, "pass": pas, "cfg": kw, "base_ms": base[pas + "_ms"]}
            try:
                mk = P.fwd if pas == "fwd" else P.bwd
                outs = P.outs_f if pas == "fwd" else P.outs_b
                # a dict value changes fields of a nested config (PreCfg.pr, PreCfg.agg)
                lst = mk(dataclasses.replace(P.cfg, **{
                    k: dataclasses.replace(getattr(P.cfg, k), **v) if isinstance(v, dict) else v
                    for k, v in kw.items()}))
                for t in outs:
                    t.fill_(float("nan"))
                run(lst)
                torch.cuda.synchronize()
                rec["max_rel_diff_vs_default"] = max(
                    ((o.float() - b0.float()).norm() / b0.float().norm().clamp_min(1e-30)).item()
                    if torch.isfinite(o.float()).all() else float("inf") for o, b0 in zip(outs, base[pas]))
                rec["ms"] = bench(lambda: run(lst), rep=100)
                byts = P.bytes_f if pas == "fwd" else P.bytes_b
                rec["pct_of_copy"] = 100 * byts / rec["ms"] / 1e6 / copy_bw
            except Exception:
                rec["error"] = traceback.format_exc(limit=3)[-600:]
            RESULTS["sweeps"].append(rec)
            print(json.dumps(rec), flush=True)
        del P
        torch.cuda.empty_cache()


def memcheck():
    """One small, odd-shaped run of every kernel (run under compute-sanitizer)."""
    import test_mhc_cutile_gpu as G

    from tilekernels._glue import poisoned

    with poisoned(True):
        c = dict(T=37, n=3, C=100, h=F32, bias=True, act=BF)
        print("h_aggregate", G.run_h_aggregate(c))
        print("h_post_bda", G.run_h_post_bda(c))
        print("h_post_bda bf16 h", G.run_h_post_bda(dict(c, h=BF)))
        print("h_post_bda nobias", G.run_h_post_bda(dict(c, bias=False, T=5, n=4, C=256)))
        print("sinkhorn", G.run_sinkhorn(dict(T=37, n=3, iters=20)))
        print("sinkhorn n4", G.run_sinkhorn(dict(T=37, n=4, iters=20)))
        print("proj_rms", G.run_proj_rms(dict(M=37, n=3, C=100)))
        print("proj_rms n4 (transposed dweight, 128-row fwd)", G.run_proj_rms(dict(M=37, n=4, C=100)))
        print("proj_rms n8", G.run_proj_rms(dict(M=37, n=8, C=64)))
        print("pre", G.run_pre(dict(T=37, n=3, C=100, iters=20)))
        print("pre n8 (entries mix)", G.run_pre(dict(T=37, n=8, C=64, iters=20)))
    torch.cuda.synchronize()
    print("memcheck run done")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--phases", default="env,time,sweep,compile")
    ap.add_argument("--ops", default="mhc_h_aggregate,mhc_h_post_bda,mhc_sinkhorn,mhc_proj_rms,mhc_pre")
    ap.add_argument("--sweep-seconds", type=float, default=200)
    ap.add_argument("--memcheck", action="store_true")
    ap.add_argument("--shape", default=None, help="T,n,C instead of the headline 32768,4,7168")
    ap.add_argument("--sweep", default=None,
                    help='JSON {op: [[pass, {field: value}], ...]} to sweep instead of SWEEPS')
    a = ap.parse_args()
    if a.memcheck:
        return memcheck()
    global T, n, C
    if a.shape:
        T, n, C = (int(v) for v in a.shape.split(","))
        RESULTS["shape"] = {"T": T, "n": n, "C": C}
    if a.sweep:
        SWEEPS.clear()
        SWEEPS.update({op: [(ps, kw) for ps, kw in v] for op, v in json.loads(a.sweep).items()})
    torch.manual_seed(0)
    ops = a.ops.split(",")
    phases = a.phases.split(",")
    bw: list = []
    path = os.path.join(a.out, "mhc_cutile_check.json")

    def save():
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)

    phase_env(bw)
    save()
    if "time" in phases:
        phase_time(ops, bw[0], ["eager"])
        save()
    if "sweep" in phases:
        phase_sweep(ops, bw[0], time.time() + a.sweep_seconds)
        save()
    if "compile" in phases:
        phase_time(ops, bw[0], ["eager", "compile"])
        save()
    print("\n%-16s %8s %8s %9s %8s %7s %8s %8s %8s" % ("op", "fwd ms", "bwd ms", "f+b ms", "GB/s", "%copy",
                                                       "x eager", "x compile", "x parts"))
    for x in RESULTS["records"]:
        print("%-16s %8.3f %8.3f %9.3f %8.0f %7.1f %8.2f %8.2f %8.2f" % (
            x["op"], x["ms_fwd"], x["ms_bwd"], x["ms_fwd_bwd"], x["gb_s_fwd_bwd"], x["pct_of_copy"],
            x.get("ratio_eager", float("nan")), x.get("ratio_compile", float("nan")),
            x.get("ratio_parts", float("nan"))))
    print(f"copy {bw[0]:.0f} GB/s on {RESULTS['env']['device']}; errors: {len(RESULTS['errors'])}")


if __name__ == "__main__":
    main()
