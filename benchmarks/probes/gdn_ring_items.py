"""gdn_decode's ring kernel at B=32 with smaller work items: is B=32's miss (issue 12, <= 35 us fp32) the item size?

Why (session 38): at Qwen3-Next (Hk=16, Hv=32, dk=dv=128) an item is (row, key head): 2 value heads, 128 KiB of fp32
state read and written, 512 items over 264 CTA slots (1.94 waves). The ring's memory pattern alone (SKELETON 2)
took 35.65 us there (session 20) against 34.0-34.6 for the copy of its bytes, so the pattern itself misses. Smaller
items give the block scheduler more, shorter CTAs to balance. This probe times the kernel as it is at head shapes
with the same state bytes but smaller items, as proxies for an item split the kernel does not have yet:
  Hk=16 Hv=32 dv=128: today's items (2 heads, 128 KiB);
  Hk=32 Hv=32 dv=128: one head an item (64 KiB), 1024 items;
  Hk=64 Hv=64 dv=64:  half a head an item (32 KiB), 2048 items;
  Hk=8  Hv=32 dv=128: 4 heads an item (256 KiB), 256 items (one wave).
Each row: the heuristic's config (checked against the torch reference), its memory pattern alone (SKELETON 2: tiles
loaded and stored back, wrong results by design), and the copy of the step's bytes (an SM kernel, the same timer:
gdn_decode_check.bench_graph, CUDA-graph replay median). ``python benchmarks/probes/gdn_ring_items.py [--b 32]
[--out DIR]`` (cute bundle)."""
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

SHAPES = {"today": dict(Hk=16, Hv=32, dk=128, dv=128, W=4), "head": dict(Hk=32, Hv=32, dk=128, dv=128, W=4),
          "half": dict(Hk=64, Hv=64, dk=128, dv=64, W=4), "quad": dict(Hk=8, Hv=32, dk=128, dv=128, W=4)}


def rows_for(name: str, B: int, rep: int, variant: str = "") -> list[dict]:
    """The rows of one head shape at batch B (G.SHAPE set to it for the helpers): the ring at the heuristic's config
    with ``variant``'s changes, its memory pattern alone, and (for the heuristic's row only) the copy."""
    G.SHAPE.clear()
    G.SHAPE.update(SHAPES[name])
    args = G.problem(B, torch.float32)
    x, conv, w, A, dt, ssm, idx, o = args
    s = SHAPES[name]  # a variant: the heuristic's config with its fields changed (the ring's own "K=V,K=V" parser)
    cfg = (R.variant_cfg(variant.replace(";", ","), s["Hk"], s["Hv"], s["dk"], s["dv"], s["W"], 4) if variant
           else R.ring_config(x, conv, w, ssm, idx, s["Hk"]))
    nbytes = G.decode_bytes(B, **G.SHAPE, selt=4)
    out = []
    for tag, c in (("kernel", cfg), ("pattern", dataclasses.replace(cfg, SKELETON=2, PF=False, AHEAD=False))):
        ln = R.decode_launch(*args, G.SHAPE["Hk"], 1e-6, None, cfg=c)
        ok = "probe" if c.SKELETON else ("ok" if G.check(args, ln)[1] else "WRONG")
        us = G.bench_graph(ln.run, rep=rep)
        out.append(dict(shape=name, B=B, row=tag, variant=variant, items=B * G.SHAPE["Hk"], ctas=ln.grid[0],
                        stages=c.STAGES, us=us, bytes=nbytes, check=ok))
    if variant:
        return out
    cp = G.copy_case(B, torch.float32, rep=rep)
    out.append(dict(shape=name, B=B, row="copy", variant="", items=0, ctas=0, stages=0, us=cp["us"], bytes=nbytes,
                    check="ok" if cp["ok"] else "WRONG"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--b", default="32")
    ap.add_argument("--shapes", default="today,head,half,quad")
    ap.add_argument("--variants", default="", help="comma list of ring config changes 'K=V;K=V' beside the "
                    "heuristic's (session 38: CPS 3 / 4 with 128 consumers and 32-column tiles)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rep", type=int, default=200)
    ap.add_argument("--out", default=os.environ.get("OUT") or ".")
    a = ap.parse_args(argv)
    rows, shape0 = [], dict(G.SHAPE)
    for rnd in range(a.rounds):  # rounds interleave the shapes (the board's drift spreads over all of them)
        for B in (int(v) for v in a.b.split(",")):
            for name in a.shapes.split(","):
                for v in [""] + [v for v in a.variants.split(",") if v]:
                    rows += [dict(r, round=rnd) for r in rows_for(name, B, a.rep, v)]
    G.SHAPE.clear()
    G.SHAPE.update(shape0)  # gdn_decode_check's module-wide shape as it was
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gdn_ring_items.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"{'shape':<6} {'B':>4} {'row':<8} {'variant':<30} {'items':>6} {'CTAs':>5} {'st':>3} {'us':>8} {'% copy t':>9}"
          f"  check  rnd")
    copy = {(r["shape"], r["B"], r["round"]): r["us"] for r in rows if r["row"] == "copy"}
    for r in rows:
        pct = 100 * copy[(r["shape"], r["B"], r["round"])] / r["us"]
        print(f"{r['shape']:<6} {r['B']:4d} {r['row']:<8} {r['variant'] or '-':<30} {r['items']:6d} {r['ctas']:5d} {r['stages']:3d} "
              f"{r['us']:8.2f} {pct:9.1f}  {r['check']:<6} {r['round']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
