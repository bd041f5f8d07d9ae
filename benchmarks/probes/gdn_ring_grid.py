"""gdn_decode's ring kernel with one (row, key head) item a CTA (a grid of B * Hk CTAs, the hardware's scheduler
handing them out) against its persistent grid (SMs x CPS CTAs walking items g, g + grid, ..).

Why (session 20, benchmarks/probes/tma_promo_probe.py, H200): the ring's memory pattern streamed B=256's fp32 state
at 272.8 us on the persistent grid and 266.7 us with one item a CTA (copy 258.9). CUDA-graph replay medians (the
check script's harness), each config checked against the torch reference first. Call 7 (session 20) also ran the
bf16 state and SKELETON 2 rows (benchmarks/results/h200-gdn-decode-cute.txt).
``python benchmarks/probes/gdn_ring_grid.py`` (cute bundle)."""
from __future__ import annotations

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gdn_decode_check as G  # noqa: E402
from tilekernels.gdn import cute_decode_ring as R  # noqa: E402


def main(argv) -> int:
    rows = []
    batches = [int(v) for v in (argv[1] if len(argv) > 1 else "32,64,128,256").split(",")]
    for sd in (torch.float32,):
        for B in batches:
            args = G.problem(B, sd)
            # calls 7-8's base: persistent CTAs, 2 stages (the heuristic then; ring_config now picks ITEM_GRID and
            # 3 stages from STAGES3_FROM items itself)
            base = dataclasses.replace(R.ring_config(args[0], args[1], args[2], args[5], args[6], G.SHAPE["Hk"]),
                                       ITEM_GRID=False, STAGES=2)
            items = B * G.SHAPE["Hk"]
            variants = [("persistent", base, None), ("item a CTA", base, items),
                        ("item a CTA, 3 stages", dataclasses.replace(base, STAGES=3), items),
                        ("item a CTA, no PF", dataclasses.replace(base, PF=False, AHEAD=False), items),
                        ("item a CTA, 3 stages no PF", dataclasses.replace(base, STAGES=3, PF=False, AHEAD=False),
                         items)]
            for name, cfg, ctas in variants:
                ln = R.decode_launch(*args, G.SHAPE["Hk"], 1e-6, None, cfg=cfg, ctas=ctas)
                ok = "probe" if cfg.SKELETON else ("ok" if G.check(args, ln)[1] else "WRONG")
                rows.append((str(sd)[6:], B, name, ln.grid[0], G.bench_graph(ln.run, rep=100), ok))
            rows.append((str(sd)[6:], B, "copy", 0, G.copy_case(B, sd, rep=100)["us"], ""))
    print(f"{'state':<9} {'B':>4} {'grid':<28} {'CTAs':>5} {'us':>8}  check")
    for sd, B, name, g, us, ok in rows:
        print(f"{sd:<9} {B:4d} {name:<28} {g:5d} {us:8.2f}  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
