"""The fused MXFP8 grouped MLP (cute backend, through the registry) beside its peers, in one run.

Issue 11's shapes (H200): G=8 experts x 4096 tokens, H=7168, F=2048; and G=32 x 1024, H=4096,
F=1536. One harness for everyone: ``triton.testing.do_bench`` median; every fwd+bwd step sets
the leaves' grads to None and backpropagates the same pre-made grad output.

Rows:
  cute     registry.get("grouped_mlp_mxfp8") (MXFP8: quantize, FC1 grouped GEMM, SwiGLU +
           quantize, FC2 grouped GEMM; backward likewise), m_splits on the GPU
  bf16     torch: torch._grouped_mm + SwiGLU (s = 32) + torch._grouped_mm, autograd
  cute_K   the same with the cute backend's GEMM path forced to K (``--kernels predq,dq`` or
           $MOE_MLP_KERNELS; cute_kernels.set_gemm_kernel), e.g. the predq default beside the
           mainloop-dequant kernel in one run; K = ``fp32dq``: "auto" with
           ``cute_kernels.PREDQ_FP32_DEFAULT`` off (the fp32 intermediates h and dA on the
           mainloop-dequant kernel instead of dequantize + cute_gemm_bf16: the path before it);
           K = ``bf16cute``: auto with ``gemm_predq.BF16_OUT_GEMM = "cute"`` (the bf16 outputs
           of fwd / dgrad, y and dX, on cute_gemm_bf16 too instead of torch._grouped_mm + copy);
           K = ``qdq``: auto with ``cute_kernels.QDQ`` on (the operands quantized only to be
           dequantized, the weights, x, go through one quantize-dequantize pass, cute_qdq);
           K = ``wg``: auto with the wgrads on cute_gemm_bf16 (``gemm_predq.WGRAD_GEMM``, no
           output copy, at any tokens per expert); K = ``qdqwg``: both; K = ``old``: auto with
           both off (QDQ off, wgrad on torch._grouped_mm + copy or, below WGRAD_MIN_TOKENS, dq);
           K = ``qdqout`` / ``noqdqout``: auto with ``cute_kernels.QDQ_OUT`` on / off (the SwiGLU
           kernels write the bf16 GEMM operands directly, dY through cute_qdq); K = ``qdqoutbf``:
           ``qdqout`` with ``bf16cute``
  fp8row   torch._scaled_grouped_mm (fp8 e4m3, per-row scales, not MXFP8): the two forward
           GEMMs only, operands pre-quantized (the issue's fp8 reference point)
TFLOP/s counts the GEMMs only: fwd 6*M*H*F (FC1 2*M*2F*H + FC2 2*M*H*F), bwd twice that.
Also checks the cute forward against the torch reference (bf16 tolerance) once per shape.
``--profile``: per shape and row, a torch.profiler kernel table of one fwd and one fwd+bwd step
(kernel name, launches, total us per step; the bwd table is fwd+bwd), printed and written to
``DIR/moe-mlp-profile.txt``.

    python3 benchmarks/moe_mlp_check.py [--out DIR] [--shapes g8,g32] [--kernels qdq] [--profile]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import registry
from tilekernels.moe import bench as mb
from tilekernels.moe import cute_kernels as ck
from tilekernels.moe import reference as ref
from tilekernels.testing import rel_err

SHAPES = {"g8": dict(G=8, per=4096, H=7168, F=2048), "g32": dict(G=32, per=1024, H=4096, F=1536)}


def _inputs(G, per, H, F):
    M = G * per
    dev = "cuda"
    x = torch.randn(M, H, device=dev).to(torch.bfloat16).requires_grad_()
    probs = torch.rand(M, device=dev).requires_grad_()
    w1 = (torch.randn(G, 2 * F, H, device=dev) / H ** 0.5).to(torch.bfloat16).requires_grad_()
    w2 = (torch.randn(G, H, F, device=dev) / F ** 0.5).to(torch.bfloat16).requires_grad_()
    m = torch.full((G,), per, dtype=torch.int64, device=dev)
    return x, probs, m, w1, w2


def bf16_mlp(x, probs, m, w1, w2):
    """torch's bf16 path (tilekernels.moe.bench.bf16_mlp, tk-bench's peer) with m_splits m."""
    return mb.bf16_mlp(x, probs, torch.cumsum(m, 0).to(torch.int32), w1, w2)


def fp8row_gemms(x, m, w1, w2, F):
    """The two forward GEMMs with torch's fp8 rowwise grouped GEMM (operands pre-quantized;
    tilekernels.moe.bench's fp8row peer)."""
    return mb.fp8row_mlp_peer((x, None, m, w1, w2), {})


_DEFAULTS = (ck._GEMM_KERNEL[0], ck.PREDQ_FP32_DEFAULT, ck.pq.BF16_OUT_GEMM, ck.QDQ, ck.pq.WGRAD_GEMM, ck.QDQ_OUT)


def _with_kernel(kern, f):
    """f() with the cute GEMM path ``kern`` (None: the defaults this process started with;
    "fp32dq": auto with PREDQ_FP32_DEFAULT off; "bf16cute": auto with the bf16 outputs of fwd /
    dgrad on cute_gemm_bf16 too; "qdq": auto with cute_kernels.QDQ on; "noqdq": auto with it
    off; "wg": auto with the wgrads on cute_gemm_bf16 (gemm_predq.WGRAD_GEMM = "cute"); "qdqwg":
    both; "old": auto with both off, the path before them); the backward (run later by autograd) reads the path when it
    runs, so the switch stays set until the next call resets it (every row sets it: a row
    left switched by the previous shape's last row would time the wrong path)."""
    kern0, fp32, bf16, qdq, wg, qout = _DEFAULTS
    ck.PREDQ_FP32_DEFAULT = fp32 if kern != "fp32dq" else False
    ck.pq.BF16_OUT_GEMM = "cute" if kern in ("bf16cute", "qdqoutbf") else bf16
    ck.QDQ_OUT = {"qdqout": True, "qdqoutbf": True, "noqdqout": False}.get(kern, qout)
    ck.QDQ = {"qdq": True, "qdqwg": True, "noqdq": False, "old": False}.get(kern, qdq)
    ck.pq.WGRAD_GEMM = {"wg": "cute", "qdqwg": "cute", "old": "torch"}.get(kern, wg)
    auto = ("fp32dq", "bf16cute", "qdq", "noqdq", "wg", "qdqwg", "old", "qdqout", "noqdqout", "qdqoutbf")
    ck.set_gemm_kernel(kern0 if kern is None else ("auto" if kern in auto else kern))
    return f()


def _fwd_bwd(f, leaves, dy):
    def step():
        for t in leaves:
            t.grad = None
        f().backward(dy)
    return step


def _profile(step, n: int = 3) -> list[tuple[str, int, float]]:
    """(kernel name, launches per step, device us per step) of ``step``, from torch.profiler over
    n steps after one warm-up, largest first."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = ev.cuda_time_total
        if us > 0 and ev.count:
            rows.append((ev.key, ev.count // n, us / n))
    return sorted(rows, key=lambda r: -r[2])


def _profile_table(title: str, rows) -> str:
    tot = sum(r[2] for r in rows)
    out = [f"== {title}: {tot:.0f} us of kernels per step",
           f"{'us':>9} {'%':>5} {'n':>4}  kernel"]
    for name, cnt, us in rows:
        out.append(f"{us:9.1f} {100 * us / tot:5.1f} {cnt:4d}  {name[:110]}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default="g8,g32")
    ap.add_argument("--kernels", default=os.environ.get("MOE_MLP_KERNELS", ""),
                    help="comma list of cute GEMM paths to time beside the default (predq, dq, fp32dq, bf16cute, "
                         "qdq, noqdq, wg, qdqwg, old, qdqout, noqdqout, qdqoutbf)")
    ap.add_argument("--profile", action="store_true", help="kernel tables per shape and row (torch.profiler)")
    ap.add_argument("--wait-for", default=None,
                    help="run every row once per shape first (compiles the kernels while other GPU work "
                         "runs), then wait for this file before timing")
    a = ap.parse_args()
    prof_txt = []
    kerns = list(filter(None, a.kernels.split(",")))
    if a.wait_for:
        import time

        from _gpu import wait_for

        t0 = time.perf_counter()
        op = registry.get("grouped_mlp_mxfp8")
        for name in a.shapes.split(","):
            x, probs, m, w1, w2 = _inputs(**SHAPES[name])
            for kern in [None, *kerns]:
                _fwd_bwd(lambda: _with_kernel(kern, lambda: op(x, probs, m, w1, w2)), (x, probs, w1, w2),
                         torch.ones(x.shape, dtype=x.dtype, device=x.device))()
            del x, probs, m, w1, w2
        torch.cuda.synchronize()
        print(f"warmed every row in {time.perf_counter() - t0:.1f} s", flush=True)
        wait_for(a.wait_for, 170)
    from triton.testing import do_bench

    op = registry.get("grouped_mlp_mxfp8")
    rows = []
    for name in a.shapes.split(","):
        s = SHAPES[name]
        G, per, H, F = s["G"], s["per"], s["H"], s["F"]
        M = G * per
        x, probs, m, w1, w2 = _inputs(G, per, H, F)
        leaves = (x, probs, w1, w2)
        fl = 6 * M * H * F
        backend = op.choose(op.bind(x, probs, m, w1, w2))
        with torch.no_grad():
            y = op(x, probs, m, w1, w2)
            xs = slice(0, 2 * per)  # two experts of the reference (the float64 reference is slow)
            yr = ref.grouped_mlp_mxfp8(x[xs].double(), probs[xs].double(), m[:2].cpu(),
                                       w1[:2].double(), w2[:2].double())
            err = rel_err(y[xs], yr)
        dy = torch.randn(M, H, device="cuda").to(torch.bfloat16)
        res = {"shape": name, **s, "M": M, "backend": backend, "fwd_rel_err_2experts": err}
        runs = {
            "cute": (lambda: _with_kernel(None, lambda: op(x, probs, m, w1, w2))),
            "bf16": (lambda: bf16_mlp(x, probs, m, w1, w2)),
        }
        for kern in kerns:
            runs[f"cute_{kern}"] = (lambda kern=kern: _with_kernel(kern, lambda: op(x, probs, m, w1, w2)))
        for k, f in runs.items():
            try:
                with torch.no_grad():
                    res[f"{k}_fwd_ms"] = do_bench(f, warmup=50, rep=300, return_mode="median")
                res[f"{k}_fwdbwd_ms"] = do_bench(_fwd_bwd(f, leaves, dy), warmup=30, rep=300,
                                                 return_mode="median")
                res[f"{k}_bwd_ms"] = res[f"{k}_fwdbwd_ms"] - res[f"{k}_fwd_ms"]
                res[f"{k}_fwd_tflops"] = fl / res[f"{k}_fwd_ms"] / 1e9
                res[f"{k}_bwd_tflops"] = 2 * fl / res[f"{k}_bwd_ms"] / 1e9
            except Exception as e:  # noqa: BLE001
                res[f"{k}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            if a.profile and f"{k}_error" not in res:
                with torch.no_grad():
                    t = _profile_table(f"{name} {k} fwd", _profile(f))
                t += "\n" + _profile_table(f"{name} {k} fwd+bwd", _profile(_fwd_bwd(f, leaves, dy)))
                print(t, flush=True)
                prof_txt.append(t)
        try:
            res["fp8row_fwd_gemms_ms"] = do_bench(fp8row_gemms(x, m, w1, w2, F), warmup=50, rep=300,
                                                  return_mode="median")
            res["fp8row_fwd_tflops"] = fl / res["fp8row_fwd_gemms_ms"] / 1e9
        except Exception as e:  # noqa: BLE001
            res["fp8row_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(res)
        print(json.dumps(res), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if prof_txt:
        with open(os.path.join(a.out, "moe-mlp-profile.txt"), "w") as f:
            f.write("\n\n".join(prof_txt) + "\n")
    with open(os.path.join(a.out, "moe-mlp-check.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"\n{'shape':6} {'backend':8} {'fwd ms':>8} {'TF/s':>6} {'bwd ms':>8} {'TF/s':>6}   "
          f"{'bf16 fwd':>8} {'bwd':>8}   {'fp8row fwd':>10}  rel_err")
    for r in rows:
        g = lambda k: r.get(k, float("nan"))  # noqa: E731
        print(f"{r['shape']:6} {r['backend']:8} {g('cute_fwd_ms'):8.3f} {g('cute_fwd_tflops'):6.0f} "
              f"{g('cute_bwd_ms'):8.3f} {g('cute_bwd_tflops'):6.0f}   {g('bf16_fwd_ms'):8.3f} {g('bf16_bwd_ms'):8.3f}"
              f"   {g('fp8row_fwd_gemms_ms'):10.3f}  {r['fwd_rel_err_2experts']:.2e}")
        for k in sorted(x for x in r if x.startswith("cute_") and x.endswith("_fwd_ms") and x != "cute_fwd_ms"):
            n = k[:-len("_fwd_ms")]
            print(f"{'':6} {n:8} {g(k):8.3f} {g(n + '_fwd_tflops'):6.0f} {g(n + '_bwd_ms'):8.3f} "
                  f"{g(n + '_bwd_tflops'):6.0f}")


if __name__ == "__main__":
    main()
