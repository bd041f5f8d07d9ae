"""gdn_decode's ring kernel as a programmatic dependent launch (PDL): what does it take off a decode step? (issue 12)

Why (session 39): at B=32 (fp32 state, Qwen3-Next) the kernel takes ~37.8 us graph-replayed against 34.3 for a copy of
its bytes and 35.3 for its memory pattern alone; the target is 35. Items, CTAs an SM, prefetch and stores were
measured before (benchmarks/results/gdn.md). Not yet: the time a step spends being launched, its CTAs placed and
their shared memory and barriers set up while the SMs have no state in flight. With ``DecodeRingCfg.PDL`` the CTAs
let the next kernel launch at their start and wait (griddepcontrol.wait) for the kernel before them before any global
access, so the next step's CTAs take SM slots as this step's CTAs retire and set up there.

Rows (CUDA-graph replay medians, gdn_decode_check.bench_graph, a step's us):
  chain:    decode steps back to back (the previous kernel is a decode step: the most PDL can give);
  neighbor: each step after a small unrelated elementwise kernel (torch.neg over 1 MiB, no PDL trigger: what a
            model whose other kernels do not trigger gets), that kernel's own graph time subtracted;
and the copy of the step's bytes. Every PDL config is checked first: 6 chained steps in one CUDA graph give the state
and o bitwise equal to 6 steps of the default config (the same math; a missed dependency reads a state row before
the step before wrote it). ``python benchmarks/probes/gdn_ring_pdl.py [--b 32,256] [--sd fp32,bf16] [--out DIR]``
(cute bundle)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gdn_decode_check as G  # noqa: E402
from tilekernels.gdn import cute_decode_ring as R  # noqa: E402

SDS = {"fp32": torch.float32, "bf16": torch.bfloat16}


def chained_equal(B: int, sd: torch.dtype, cfg, steps: int = 6) -> bool:
    """``steps`` steps at ``cfg`` captured in one CUDA graph and replayed once, against the same steps at
    cfg with PDL off run eagerly: o, conv_state and ssm_state bitwise equal."""
    args = G.problem(B, sd)
    x, conv, w, A, dt, ssm, idx, o = args
    ref_args = [t.clone() if isinstance(t, torch.Tensor) else t for t in args]
    base = dataclasses.replace(cfg, PDL=False)
    lb = R.decode_launch(*ref_args, G.SHAPE["Hk"], 1e-6, None, cfg=base)
    for _ in range(steps):
        lb.run()
    lp = R.decode_launch(*args, G.SHAPE["Hk"], 1e-6, None, cfg=cfg)
    lp.run()  # compile outside the capture, then restore the inputs
    torch.cuda.synchronize()
    fresh = G.problem(B, sd)  # new random tensors for both sides (same values)
    for dst, src in zip(args, fresh):
        dst.copy_(src)
    for dst, src in zip(ref_args, fresh):
        dst.copy_(src)
    for _ in range(steps):
        lb.run()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for _ in range(steps):
                lp.run()
    torch.cuda.current_stream().wait_stream(s)
    for dst, src in zip(args, fresh):  # the capture did not run the steps; start from the same inputs
        dst.copy_(src)
    g.replay()
    torch.cuda.synchronize()
    return all(torch.equal(a, b) for a, b in zip(args, ref_args))


def rows_for(B: int, sd: torch.dtype, rep: int) -> list[dict]:
    args = G.problem(B, sd)
    x, conv, w, A, dt, ssm, idx, o = args
    base = R.ring_config(x, conv, w, ssm, idx, G.SHAPE["Hk"])
    pad_a = torch.randn(1 << 18, device="cuda")
    pad_b = torch.empty_like(pad_a)
    neighbor = lambda: torch.neg(pad_a, out=pad_b)  # noqa: E731
    t_nb = G.bench_graph(neighbor, rep=rep)
    out = [dict(B=B, sd=str(sd)[6:], row="neighbor alone", pdl=False, us=t_nb, check="-")]
    for pdl in (False, True):
        cfg = dataclasses.replace(base, PDL=pdl)
        ln = R.decode_launch(*args, G.SHAPE["Hk"], 1e-6, None, cfg=cfg)
        ok = G.check(args, ln)[1] and (not pdl or chained_equal(B, sd, cfg))
        chk = "ok" if ok else "WRONG"
        out.append(dict(B=B, sd=str(sd)[6:], row="chain", pdl=pdl, us=G.bench_graph(ln.run, rep=rep), check=chk))

        def both(ln=ln):
            neighbor()
            ln.run()
        out.append(dict(B=B, sd=str(sd)[6:], row="neighbor", pdl=pdl, us=G.bench_graph(both, rep=rep) - t_nb,
                        check=chk))
    cp = G.copy_case(B, sd, rep=rep)
    out.append(dict(B=B, sd=str(sd)[6:], row="copy", pdl=False, us=cp["us"], check="ok" if cp["ok"] else "WRONG"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--b", default="32,256")
    ap.add_argument("--sd", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rep", type=int, default=200)
    ap.add_argument("--out", default=os.environ.get("OUT") or ".")
    a = ap.parse_args(argv)
    rows = []
    for rnd in range(a.rounds):
        for B in (int(v) for v in a.b.split(",")):
            for sd in a.sd.split(","):
                rows += [dict(r, round=rnd) for r in rows_for(B, SDS[sd], a.rep)]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gdn_ring_pdl.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"{'B':>4} {'state':<9} {'row':<15} {'PDL':<5} {'us':>8}  check  rnd")
    for r in rows:
        print(f"{r['B']:4d} {r['sd']:<9} {r['row']:<15} {str(r['pdl']):<5} {r['us']:8.2f}  {r['check']:<6} {r['round']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
