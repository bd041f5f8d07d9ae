#!/usr/bin/env python3
"""Device host, between a sweep and the tests: pick the gdn_pre_gated forward default from a
``gdn_pre_check.py --sweep --sweep-all`` JSON and write it into the device's copy of
tilekernels/gdn/cutile_pre_gated.py (its FWD_... defaults line), so that the GPU tests, the
sanitizers and the four timed cases that follow run the config that becomes the default.

    python3 benchmarks/probes/gdn_pre_fwd_choose.py SWEEP_JSON [--write]

The winner: the lowest sum of medians over the four cases (BSHD/THD x repeat_qk on/off) among the
variants measured in all four and correct in all four (rel. error at the bf16 tolerance); a variant
within 1% of the current default's sum does not replace it. Variants must be expressible by the
defaults line (HB = 1; FT from FWD_EL = FT * 128 at dk = dv = 128; MA, OCCH, SX).
"""
from __future__ import annotations

import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILE = os.path.join(ROOT, "tilekernels", "gdn", "cutile_pre_gated.py")
LINE = re.compile(r"^FWD_HB, FWD_HBZ, FWD_EL, FWD_OCC, FWD_NW, FWD_CB, FWD_ZC, FWD_MA, FWD_OCCH, FWD_SX = .*$", re.M)
CASES = ("bshd-rep", "bshd-norep", "thd-rep", "thd-norep")


def line_for(over: dict) -> str:
    v = (over.get("HB", 1), over.get("HBZ", 4), over.get("FT", 32) * 128, over.get("OCC", 4), over.get("NW", 0),
         bool(over.get("CB", False)), over.get("ZC", 0), bool(over.get("MA", False)), over.get("OCCH", 0),
         bool(over.get("SX", False)))
    return "FWD_HB, FWD_HBZ, FWD_EL, FWD_OCC, FWD_NW, FWD_CB, FWD_ZC, FWD_MA, FWD_OCCH, FWD_SX = " + \
        ", ".join(map(str, v))


def main():
    res = json.load(open(sys.argv[1]))
    by: dict = {}
    for r in res["records"]:
        if r.get("sweep") and not r.get("w1"):
            by.setdefault(r["impl"], {})[r["case"]] = r
    src = open(FILE).read()
    cur = LINE.search(src).group(0)
    rows = []
    for impl, c in by.items():
        over = c[next(iter(c))].get("over", {})
        ok = all(k in c and float(c[k]["err"].split()[-1]) <= 1e-2 for k in CASES) and set(over) <= {
            "FT", "OCC", "NW", "CB", "HBZ", "ZC", "MA", "OCCH", "SX"}
        rows.append((sum(c[k]["ms"] for k in CASES) if ok else float("inf"), impl, over))
    rows.sort(key=lambda t: t[0])
    for tot, impl, over in rows:
        print(f"choose: {impl:<30} sum of 4 cases {tot:.3f} ms  -> {line_for(over)}", flush=True)
    cur_tot = next((t for t, _, o in rows if line_for(o) == cur), float("inf"))
    best = rows[0]
    pick = best if best[0] < 0.99 * cur_tot else next((r for r in rows if line_for(r[2]) == cur), best)
    new = line_for(pick[2])
    print(f"choose: current `{cur}` ({cur_tot:.3f} ms); picked `{new}` ({pick[1]}, {pick[0]:.3f} ms)", flush=True)
    if "--write" in sys.argv and new != cur and pick[0] < float("inf"):
        open(FILE, "w").write(LINE.sub(new, src))
        print("choose: wrote", FILE, flush=True)


if __name__ == "__main__":
    main()
