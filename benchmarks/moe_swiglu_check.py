#!/usr/bin/env python3
"""GPU timing of the CuTe DSL SwiGLU kernels (tilekernels/moe/cute_swiglu.py); run on the device host.

    python3 benchmarks/moe_swiglu_check.py [--out DIR] [--M 32768] [--F 2048] [--no-compile] [--no-sweep]

Measures the copy bandwidth (2 GiB device-to-device copy), then at M x F (default 32768 x 2048,
the MLP's headline shape) times, with triton.testing.do_bench (median):

* scaled_swiglu fwd / bwd (bf16 and fp32 h, s = 32 and halves): the CuTe kernel, the torch
  reference (``reference.scaled_swiglu`` / ``scaled_swiglu_bwd``) and (s = 32) torch.compile of it;
* the fused SwiGLU + MXFP8 forward (rowwise only / rowwise + columnwise) and backward (dh both ways
  + dprobs, with / without a's columnwise copy): the CuTe kernel, the torch path (the fp32
  reference math + ``mxfp8.quantize``) and torch.compile of that path;
* a sweep of launch configs of the fused kernels (each checked bitwise against the default
  config's outputs before it is timed), the first version's (register loads, ``stages=0``) among
  them: the old-vs-new comparison on the same inputs.

Bytes are counted by hand: every input read once, every output written once (MXFP8 data 1 byte
per element, scales 1 byte per 32). Prints GB/s and % of the copy bandwidth; writes
``moe_swiglu_check.json`` to --out (default $OUT or .). Exit status 1 if a kernel failed its
spot check against the torch path.
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

from _gpu import bench, copy_gb_s, device_env, log_error  # noqa: E402

from tilekernels.moe import cute_swiglu as cs  # noqa: E402
from tilekernels.moe import mxfp8 as mx  # noqa: E402
from tilekernels.moe import reference as ref  # noqa: E402

BF, F32, U8 = torch.bfloat16, torch.float32, torch.uint8
RESULTS: dict = {"env": {}, "records": [], "sweeps": [], "errors": [], "checks": []}


log_err = functools.partial(log_error, RESULTS["errors"])


def u8(*s):
    return torch.empty(*s, dtype=U8, device="cuda")


def rnd(*s, dtype=F32):
    return torch.randn(*s, device="cuda").to(dtype)


def check(what, ok, detail=""):
    RESULTS["checks"].append({"what": what, "ok": bool(ok), "detail": detail})
    print(f"check {what}: {'ok' if ok else 'MISMATCH'} {detail}", flush=True)


def same_bytes(a, b):
    a = a.view(U8) if a.dtype == torch.float8_e4m3fn else a
    b = b.view(U8) if b.dtype == torch.float8_e4m3fn else b
    return torch.equal(a, b)


# ------------------------------------------------------------------ problems


def plain_problem(M, F, dtype, s, bwd):
    e = 2 if dtype == BF else 4
    h, p = rnd(M, 2 * F, dtype=dtype), torch.rand(M, device="cuda")
    if not bwd:
        out = torch.empty(M, F, dtype=dtype, device="cuda")
        nbytes = M * 2 * F * e + 4 * M + M * F * e
        return dict(
            kernel=lambda: cs.swiglu_fwd_into(h, p, out, s),
            torch=lambda: ref.scaled_swiglu(h, p, s),
            check=lambda: same_bytes(out, ref.scaled_swiglu(h, p, s)),
            bytes=nbytes)
    dout = rnd(M, F, dtype=dtype)
    dh, dprobs = torch.empty(M, 2 * F, dtype=dtype, device="cuda"), torch.empty(M, device="cuda")
    nbytes = M * F * e + M * 2 * F * e + 4 * M + M * 2 * F * e + 4 * M
    return dict(
        kernel=lambda: cs.swiglu_bwd_into(dout, h, p, dh, dprobs, s),
        torch=lambda: ref.scaled_swiglu_bwd(dout, h, p, s),
        check=lambda: same_bytes(dh, ref.scaled_swiglu_bwd(dout, h, p, s)[0]),
        bytes=nbytes)


def quant_fwd_problem(M, F, col):
    h, p = rnd(M, 2 * F), torch.rand(M, device="cuda")
    outs = [u8(M, F), u8(M, F // 32)] + ([u8(M, F), u8(M // 32, F)] if col else [None, None])
    nbytes = 8 * M * F + 4 * M + (M * F + M * F // 32) * (2 if col else 1)

    def torch_path():
        a = ref.swiglu_fwd(h, p, 32)
        return mx.quantize(a, "both" if col else "rowwise")

    def chk():
        exp = torch_path()
        return all(same_bytes(o, x) for o, x in zip(outs, exp))

    return dict(kernel=lambda: cs.swiglu_quant_fwd_into(h, p, *outs), torch=torch_path, check=chk,
                bytes=nbytes, args=(h, p, *outs), outs=outs)


def quant_bwd_problem(M, F, a_col):
    h, p, da = rnd(M, 2 * F), torch.rand(M, device="cuda"), rnd(M, F)
    dh_outs = [u8(M, 2 * F), u8(M, 2 * F // 32), u8(M, 2 * F), u8(M // 32, 2 * F)]
    dprobs = torch.empty(M, device="cuda")
    a_outs = [u8(M, F), u8(M // 32, F)] if a_col else [None, None]
    nbytes = (4 * M * F + 8 * M * F + 4 * M + 2 * (2 * M * F + 2 * M * F // 32) + 4 * M
              + ((M * F + M * F // 32) if a_col else 0))

    def torch_path():
        dh, dp = ref.swiglu_bwd(da, h, p, 32)
        out = (*mx.quantize(dh, "both"), dp)
        if a_col:
            out = (*out, *mx.quantize_columnwise(ref.swiglu_fwd(h, p, 32)))
        return out

    def chk():
        exp = torch_path()
        got = [*dh_outs] + ([*a_outs] if a_col else [])
        expb = list(exp[:4]) + (list(exp[5:]) if a_col else [])
        okb = all(same_bytes(o, x) for o, x in zip(got, expb))
        okp = torch.allclose(dprobs, exp[4], rtol=1e-5, atol=1e-6)
        return okb and okp

    args = (da, h, p, *dh_outs, dprobs, *a_outs)
    return dict(kernel=lambda: cs.swiglu_quant_bwd_into(*args), torch=torch_path, check=chk, bytes=nbytes,
                args=args, outs=[*dh_outs, dprobs] + ([*a_outs] if a_col else []))


# ------------------------------------------------------------------ phases


def phase_env():
    env = device_env()
    env["copy_gb_s"] = copy_gb_s()
    RESULTS["env"] = env
    print(json.dumps(env, indent=1), flush=True)
    return env["copy_gb_s"]


def record(name, prob, copy_bw, compile_peer):
    rec = {"op": name, "bytes": prob["bytes"]}
    try:
        t0 = time.perf_counter()
        prob["kernel"]()
        torch.cuda.synchronize()
        rec["first_call_s"] = time.perf_counter() - t0  # compile + launch
        ok = prob["check"]()
        check(name, ok)
        rec["matches_torch"] = bool(ok)
        ms = bench(prob["kernel"])
        rec.update(cute_ms=ms, cute_gb_s=prob["bytes"] / ms / 1e6, cute_pct_copy=100 * prob["bytes"] / ms / 1e6 / copy_bw)
        # host cost of one call (the kernel is asynchronous: this is the Python + launch path)
        n = 200
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            prob["kernel"]()
        rec["host_us_per_call"] = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
    except Exception:
        log_err(name)
    try:
        ms = bench(prob["torch"], rep=50)
        rec.update(torch_ms=ms, torch_gb_s=prob["bytes"] / ms / 1e6)
    except Exception:
        log_err(name + " torch")
    if compile_peer:
        try:
            fn = torch.compile(prob["torch"])
            fn()
            ms = bench(fn, rep=50)
            rec.update(compiled_ms=ms, compiled_gb_s=prob["bytes"] / ms / 1e6)
        except Exception:
            log_err(name + " torch.compile")
    RESULTS["records"].append(rec)
    print(json.dumps(rec), flush=True)
    return rec


def phase_time(M, F, copy_bw, compile_peer, quant_only=False):
    for dtype in () if quant_only else (BF, F32):
        for s in (32, None):
            for bwd in (False, True):
                name = f"scaled_swiglu_{'bwd' if bwd else 'fwd'}/{str(dtype)[6:]}/s={s}"
                # torch.compile peers at s = 32 only (the MLP's layout; each compile takes a while)
                record(name, plain_problem(M, F, dtype, s, bwd), copy_bw, compile_peer and s == 32)
                torch.cuda.empty_cache()
    for col in (False, True):
        record(f"swiglu_quant_fwd/col={col}", quant_fwd_problem(M, F, col), copy_bw, compile_peer)
        torch.cuda.empty_cache()
    for a_col in (False, True):
        record(f"swiglu_quant_bwd/a_col={a_col}", quant_bwd_problem(M, F, a_col), copy_bw, compile_peer)
        torch.cuda.empty_cache()


def _sweep_cfgs(F, bwd, col):
    """The default config, the first version's (register loads, stages = 0: fwd one block per warp),
    then cp.async variants: stages, blocks per warp (grid_x), row splits."""
    nb = F // 32
    base = cs.QuantCfg.heuristic(F, bwd, col)
    out = [base]
    if bwd:
        variants = [(4, 2, 1, 0), (4, 2, 1, 3), (8, 2, 1, 2), (8, 4, 1, 2)]
    else:  # (warps, rsplit, blocks per warp, stages); blocks per warp -> grid_x
        variants = [(4, 1, 1, 0), (4, 1, 16, 2), (4, 1, 2, 2), (4, 1, 4, 3), (8, 2, 4, 2)]
    for warps, rsplit, per_warp, st in variants:
        groups = warps // rsplit
        if groups > nb:
            continue
        grid_x = 1 if bwd else max(1, cs.cdiv(nb, groups * per_warp))
        try:
            c = cs.QuantCfg(F=F, bwd=bwd, col=col, warps=warps, rsplit=rsplit, grid_x=grid_x, stages=st)
        except ValueError:
            continue
        if c not in out:
            out.append(c)
    return out


def phase_sweep(M, F, copy_bw):
    for bwd, col in ((False, False), (False, True), (True, False), (True, True)):
        prob = quant_bwd_problem(M, F, col) if bwd else quant_fwd_problem(M, F, col)
        args, outs = prob["args"], prob["outs"]
        base_cfg = cs.QuantCfg.heuristic(F, bwd, col)
        cs.quant_launch(base_cfg).run(*args, M)
        torch.cuda.synchronize()
        outs = [o for o in outs if o is not None]   # (fwd without the columnwise output: two None)
        ref_outs = [o.clone() for o in outs]
        for cfg in _sweep_cfgs(F, bwd, col):
            rec = {"op": f"swiglu_quant_{'bwd' if bwd else 'fwd'}/col={col}", "cfg": dataclasses.asdict(cfg),
                   "bytes": prob["bytes"]}
            try:
                ln = cs.quant_launch(cfg)
                try:
                    from tilekernels import _cute
                    res = _cute.cubin_resources(ln.export("sm_90a").cubin)
                    rec["resources"] = [r for r in res.values() if "regs" in r]
                except Exception:
                    pass
                for o in outs:
                    o.fill_(0xA5 if o.dtype == U8 else float("nan"))
                ln.run(*args, M)
                torch.cuda.synchronize()
                # MXFP8 bytes bitwise; dprobs only to fp32 reassociation (the group count sets its
                # summation order), so reported apart: its norm-wise relative difference
                same = all(same_bytes(o, r) for o, r in zip(outs, ref_outs) if o.dtype == U8)
                rec["same_as_default"] = same
                for o, r in zip(outs, ref_outs):
                    if o.dtype != U8:
                        rec["dprobs_rel_diff"] = float((o.double() - r.double()).norm() / r.double().norm())
                if not same:
                    check(f"sweep {rec['op']} {cfg}", False, "MXFP8 bytes differ from the default config's")
                ms = bench(lambda: ln.run(*args, M))
                rec.update(ms=ms, gb_s=prob["bytes"] / ms / 1e6, pct_copy=100 * prob["bytes"] / ms / 1e6 / copy_bw)
            except Exception:
                log_err(f"sweep {cfg}")
            RESULTS["sweeps"].append(rec)
            print(json.dumps(rec), flush=True)
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--M", type=int, default=32768)
    ap.add_argument("--F", type=int, default=2048)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    ap.add_argument("--no-sweep", action="store_true", help="skip the config sweep")
    ap.add_argument("--quant-only", action="store_true", help="time the fused SwiGLU + MXFP8 kernels only")
    a = ap.parse_args()
    torch.manual_seed(0)
    RESULTS["shape"] = {"M": a.M, "F": a.F}
    copy_bw = phase_env()
    phase_time(a.M, a.F, copy_bw, not a.no_compile, a.quant_only)
    if not a.no_sweep:
        phase_sweep(a.M, a.F, copy_bw)
    print("\nop                                     cute ms   GB/s  %copy | torch ms  GB/s | compiled ms  GB/s")
    for r in RESULTS["records"]:
        print(f"{r['op']:38s} {r.get('cute_ms', float('nan')):8.3f} {r.get('cute_gb_s', float('nan')):6.0f} "
              f"{r.get('cute_pct_copy', float('nan')):5.1f} | {r.get('torch_ms', float('nan')):8.3f} "
              f"{r.get('torch_gb_s', float('nan')):5.0f} | {r.get('compiled_ms', float('nan')):8.3f} "
              f"{r.get('compiled_gb_s', float('nan')):5.0f}")
    for r in RESULTS["sweeps"]:
        c = r["cfg"]
        print(f"sweep {r['op']:28s} warps={c['warps']:2d} rsplit={c['rsplit']} grid_x={c['grid_x']:2d} "
              f"stages={c.get('stages', 0)} {r.get('ms', float('nan')):8.3f} ms {r.get('pct_copy', float('nan')):5.1f}% "
              f"bytes_same={r.get('same_as_default')} dprobs_rel={r.get('dprobs_rel_diff', '-')} {r.get('resources', '')}")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "moe_swiglu_check.json")
    with open(path, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    print("wrote", path, "errors:", len(RESULTS["errors"]))
    bad = [c for c in RESULTS["checks"] if not c["ok"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
