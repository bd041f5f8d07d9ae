#!/usr/bin/env python3
"""Device host: which gdn_pre_gated forward config hangs. Each candidate (PreGatedCfg fields over
the Qwen3-Next heuristic) runs in its own child process on the problem of
tests/gdn/test_gdn_cutile_pre_gated.py::test_fwd_launch_config_variants (THD, lengths
0 1 3 4 7 0 130 2 5 300, repeat_qk, conv state, bf16); the child launches the config's launches one
at a time, each followed by a device sync, and prints a line before and after each. A launch whose
sync does not return within --sync-s seconds is a hang: the child is killed (its CUDA context goes
with it) and the next candidate runs. Compiles (first launch of a key) get --compile-s.

    python3 benchmarks/probes/gdn_pre_fwd_hang.py [--out DIR] "{'FT': 16, 'HB': 4, 'ST': True}" ...

Candidates are built past PreGatedCfg's refusal of configs that hang (that refusal came from this
probe). Prints one line per candidate: ok / HANG in launch j (0: head launch, 1: main launch) / compile
timeout / error, and writes gdn_pre_fwd_hang.json to --out.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import select
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child(over: dict) -> None:
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "gdn")]
    import copy

    import torch

    from tilekernels.gdn import bench as mk
    from tilekernels.gdn import cutile_pre_gated as cp
    from tilekernels.gdn import reference as ref

    torch.manual_seed(0)
    Hk, Hv, dk, dv, W = 16, 32, 128, 128, 4
    lengths = [0, 1, 3, 4, 7, 0, 130, 2, 5, 300]
    w, A, dt = mk.weights(Hk, Hv, dk, dv, W, dtype=torch.bfloat16, device="cuda")
    cu = mk.cu_seqlens(lengths, device="cuda")
    x = mk.mixed((sum(lengths),), Hk, Hv, dk, dv, dtype=torch.bfloat16, device="cuda")
    NT, N = x.shape[0], cu.shape[0] - 1

    def nan(*s, dtype=torch.bfloat16):
        return torch.full(s, float("nan"), dtype=dtype, device="cuda")

    outs = (nan(NT, Hv, dk), nan(NT, Hv, dk), nan(NT, Hv, dv), nan(NT, Hv, dv), nan(NT, Hv, dtype=torch.float32),
            nan(NT, Hv))
    cs = nan(N, ref.conv_dim(Hk, Hv, dk, dv), W - 1)
    # built past PreGatedCfg's refusal of the configs this probe found hanging (a new compiler may fix them)
    cfg = copy.copy(cp.PreGatedCfg.heuristic(Hk, Hv, dk, dv, W, True))
    for k, val in over.items():
        object.__setattr__(cfg, k, val)
    torch.cuda.synchronize()
    for j, ln in enumerate(cp.fwd_launch(x, w, A, dt, cu, *outs, cs, Hk, dk, dv, True, 1e-6, cfg=cfg)):
        print(f"COMPILE {j}", flush=True)
        ln.run()
        print(f"LAUNCHED {j} grid={ln.grid}", flush=True)
        torch.cuda.synchronize()
        print(f"SYNCED {j}", flush=True)
    bad = sum(int(o.isnan().sum()) for o in (*outs, cs))
    print(f"DONE nan_left={bad}", flush=True)


def run_one(over: dict, compile_s: float, sync_s: float) -> dict:
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", repr(over)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, bufsize=1, cwd=ROOT, start_new_session=True)
    t0 = time.time()
    deadline = t0 + 120  # imports, inputs, first compile
    state, log = "start", []
    while True:
        left = deadline - time.time()
        if left <= 0:
            break
        r, _, _ = select.select([p.stdout], [], [], min(left, 1.0))
        if r:
            line = p.stdout.readline()
            if not line:
                break
            log.append(line.rstrip())
            if line.startswith("COMPILE"):
                state, deadline = line.strip(), time.time() + compile_s
            elif line.startswith("LAUNCHED"):
                state, deadline = line.strip(), time.time() + sync_s
            elif line.startswith("SYNCED"):
                state, deadline = line.strip(), time.time() + 30
            elif line.startswith("DONE"):
                state = line.strip()
    rc = p.poll()
    if rc is None:  # still running: kill the child's process group (its CUDA context with it)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        verdict = (f"HANG in launch {state.split()[1]}" if state.startswith("LAUNCHED")
                   else f"TIMEOUT at {state}")
    elif state.startswith("DONE"):
        verdict = "ok" if state.endswith("nan_left=0") else f"WRONG ({state})"
    else:
        verdict = f"ERROR rc={rc} at {state}: " + " | ".join(log[-3:])[-300:]
    return dict(cfg=over, verdict=verdict, seconds=round(time.time() - t0, 1), log=log[-8:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--compile-s", type=float, default=90.0)
    ap.add_argument("--sync-s", type=float, default=8.0)
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no candidate after this many seconds")
    ap.add_argument("cfgs", nargs="*")
    a = ap.parse_args()
    if a.child is not None:
        return child(ast.literal_eval(a.child))
    res, t0 = [], time.time()
    for c in a.cfgs:
        if time.time() - t0 > a.budget_s:
            print(f"hang-probe {c:<60} not run (budget)", flush=True)
            continue
        r = run_one(ast.literal_eval(c), a.compile_s, a.sync_s)
        res.append(r)
        print(f"hang-probe {c:<60} {r['verdict']}  ({r['seconds']} s)", flush=True)
        with open(os.path.join(a.out, "gdn_pre_fwd_hang.json"), "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
