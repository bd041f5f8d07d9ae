"""gdn_pre_gated's cuTile backward against the one-rounding bar (session 74): the fraction of dmixed / dconv_weight
elements off the float64 value rounded once to bf16, per config variant of the second design (PreGatedBwd2Cfg: SD
keeps the dpre scratch in bf16, SX takes the sigmoid through the MUFU tanh), and each variant's fwd+bwd time
through the registry at a Qwen3-Next layer (B=1, T=8192, Hk=16, Hv=32, dk=dv=128, W=4, bf16; do_bench median;
each step sets the leaves' grads to None and backpropagates the same pre-made grad outputs).
Since c1e3e23 the default is SD=False; SD1 is the old bf16 scratch.
Usage: python3 benchmarks/probes/gdn_cutile_bwd_rounding.py [--variants default,SD1,SD0SX0] [--out DIR]"""
import argparse
import dataclasses
import json
import os
import subprocess
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.getcwd())
import registry  # noqa: E402
from tilekernels.gdn import bench as mk  # noqa: E402
from tilekernels.gdn import cutile_pre_gated_bwd2 as b2  # noqa: E402
from tilekernels.gdn import reference as ref  # noqa: E402
from tilekernels.testing import assert_one_rounding, rel_err, upcast  # noqa: E402

VARIANTS = {"default": {}, "SD1": dict(SD=True), "SD0": dict(SD=False), "SX0": dict(SX=False),
            "SD0SX0": dict(SD=False, SX=False)}
OP = registry.get("gdn_pre_gated")


def leaves(Hk, Hv, dk, dv, W, lead, dev):
    w, A, dt = mk.weights(Hk, Hv, dk, dv, W, device=dev)
    x = mk.mixed(lead, Hk, Hv, dk, dv, device=dev)
    return [t.requires_grad_() for t in (x, w, A, dt)]


def off(o, w):
    """The fraction of o's elements off the float64 w rounded once (no bound: a variant may be far off)."""
    return assert_one_rounding(o.cpu(), w, max_fraction=1.0, max_row_fraction=1.0)


def check():
    Hk, Hv, dk, dv, W = 2, 4, 64, 64, 4
    lv = leaves(Hk, Hv, dk, dv, W, (2, 257), "cuda")
    p = dict(Hk=Hk, dk=dk, dv=dv, repeat_qk=True)
    out = OP(*lv, backend="cutile", **p)
    gouts = [torch.randn_like(o, dtype=torch.float32).to(o.dtype) for o in out]
    torch.autograd.backward(out, gouts)
    ups = [upcast(t).cpu().requires_grad_() for t in lv]
    want = ref.pre_gated(*ups, None, **p)
    torch.autograd.backward(want, [upcast(g).cpu() for g in gouts])
    return {n: dict(off=off(a.grad, b.grad), rel=rel_err(a.grad.cpu(), b.grad))
            for n, a, b in zip(("dmixed", "dconv_weight"), lv[:2], ups[:2])}


def timed(rep=50):
    Hk, Hv, dk, dv, W = 16, 32, 128, 128, 4
    lv = leaves(Hk, Hv, dk, dv, W, (1, 8192), "cuda")
    p = dict(Hk=Hk, dk=dk, dv=dv, repeat_qk=True)
    out = OP(*lv, backend="cutile", **p)
    gouts = [torch.randn_like(o, dtype=torch.float32).to(o.dtype) for o in out]

    def step():
        for t in lv:
            t.grad = None
        torch.autograd.backward(OP(*lv, backend="cutile", **p), gouts)
    return do_bench(step, rep=rep, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="default,SD1,SD0SX0")
    ap.add_argument("--one", default="", help="(internal) run one variant in this process and print its JSON")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if a.one:   # one process a variant: the registry's prepared calls keep the config of their first call
        ch = VARIANTS[a.one]
        orig = b2.PreGatedBwd2Cfg.heuristic.__func__
        b2.PreGatedBwd2Cfg.heuristic = classmethod(lambda cls, *s: dataclasses.replace(orig(cls, *s), **ch))
        r = check()
        r["fwd+bwd ms"] = timed()
        print("RESULT " + json.dumps(r), flush=True)
        return
    res = {"device": torch.cuda.get_device_name()}
    names = a.variants.split(",")   # a name given twice (an interleaved A/B) keys its runs as name#1, name#2
    keys = [f"{n}#{names[:i + 1].count(n)}" if names.count(n) > 1 else n for i, n in enumerate(names)]
    for name, key in zip(names, keys):
        p = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        res[key] = json.loads(line[0][7:]) if line else {"error": (p.stdout + p.stderr)[-1500:]}
        print(key, json.dumps(res[key])[:1600], flush=True)
    with open(os.path.join(a.out, "gdn_cutile_bwd_rounding.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'variant':10s} {'dmixed off':>11s} {'dw off':>8s} {'dmixed rel':>11s} {'fwd+bwd ms':>11s}")
    for key in keys:
        r = res[key]
        if "error" not in r:
            print(f"{key:10s} {r['dmixed']['off']:11.4f} {r['dconv_weight']['off']:8.4f} "
                  f"{r['dmixed']['rel']:11.2e} {r['fwd+bwd ms']:11.3f}")


if __name__ == "__main__":
    main()
