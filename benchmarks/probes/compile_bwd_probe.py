#!/usr/bin/env python3
"""Device host: torch.compile(fullgraph=True) of registry calls with gradients, against eager
(tests/registry/registry_gpu_helpers.compiled_fwd_bwd_check on every case with grad inputs), and, for
gdn_pre_gated's cute backward, what its kernel receives in each mode (shape, strides, offset, alignment,
contiguity, abs sum of every tensor argument; dmixed's abs sum after the call). Session 12: the compiled
backward of gdn_pre_gated (cute) returned an all-zero dmixed while eager was right, only with output poisoning
on (TILEKERNELS_POISON=1; h200-compile-fwd-bwd.txt). (Session 12's --small mode, the failing test's case step by
step, is in git history at f9317c7; the test tests/gdn/test_gdn_cute_pre_gated_bwd.py reproduces it.)

    python3 benchmarks/probes/compile_bwd_probe.py [--ops gdn_pre_gated,...] [--backend inductor|aot_eager]
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "registry")]

import torch  # noqa: E402

import registry  # noqa: E402
import registry_gpu_helpers as h  # noqa: E402
from registry.kernels import _KERNELS, has_kernel  # noqa: E402


def describe(args):
    torch.cuda.synchronize()
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            print(f"    [{i}] {tuple(a.shape)} stride {a.stride()} off {a.storage_offset()} ptr%16 {a.data_ptr() % 16} "
                  f"{str(a.dtype)[6:]} contig {a.is_contiguous()} |sum| {float(a.double().abs().sum()):.6g}", flush=True)
        elif a is not None:
            print(f"    [{i}] {a!r}", flush=True)


def wrap(key, out_index):
    orig = _KERNELS[key]

    def fn(*args):
        print(f"  {key} called (compiling: {torch.compiler.is_compiling()})", flush=True)
        describe(args)
        orig(*args)
        torch.cuda.synchronize()
        print(f"    after: output [{out_index}] |sum| {float(args[out_index].double().abs().sum()):.6g}", flush=True)
    _KERNELS[key] = fn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--trace", action="store_true", help="print gdn_pre_gated cute bwd's arguments")
    a = ap.parse_args()
    if a.trace and has_kernel("gdn_pre_gated", "cute", "bwd"):
        wrap(("gdn_pre_gated", "cute", "bwd"), 11)
    if a.backend != "inductor":
        real = torch.compile
        torch.compile = lambda f, **kw: real(f, backend=a.backend, **kw)
    ops = [o for o in a.ops.split(",") if o]
    rows = []
    for case, cid in zip(h.CASES, h.IDS):
        if not case.grad_inputs or (ops and case.op not in ops):
            continue
        op = registry.get(case.op)
        args, params = case.make(case.dims, torch.device("cuda"))
        backend = op.choose(op.bind(*args, **params))
        print(f"== {cid} (backend {backend}, compile {a.backend})", flush=True)
        try:
            errs = h.compiled_fwd_bwd_check(case)
            rows.append((cid, backend, "ok", " ".join(f"{e:.1e}" for e in errs.values())))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(limit=3)
            rows.append((cid, backend, "FAIL", str(e).splitlines()[0][:120]))
    print(f"\n{'case':<28}{'backend':<9}{'result':<7}errors (outputs, then grads)")
    for r in rows:
        print(f"{r[0]:<28}{r[1]:<9}{r[2]:<7}{r[3]}")


if __name__ == "__main__":
    main()
