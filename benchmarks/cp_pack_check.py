"""THD cp all_to_all pack/unpack: the cuTile kernels beside the torch index path (one GPU).

Shape: 8 sequences totalling 65536 tokens (lengths multiples of 16, varied; bench.cu_seqlens),
Qwen3-Next GDN in_proj sections q=k=16*128, v=z=32*128, b=a=32 (D = 12352), bf16, cp in
{2, 4, 8}. The kernels are called directly (no collective: the a2a itself is a copy at
world 1 and the network at cp > 1). Per cp and kernel:

* split     (pack cp->hp):   x [T/cp, D]        -> send [cp, T/cp, D/cp]   torch: x[rows, feature_perm]
* to_natural (unpack cp->hp): recv [T, D/cp]     -> out [T, D/cp]           torch: index_select(token_inv)
* to_rank_major (pack hp->cp): x [T, D/cp]       -> send [T, D/cp]          torch: index_select(token_perm)
* merge     (unpack hp->cp): recv [cp, T/cp, D/cp] -> out [T/cp, D]         torch: aten.index.Tensor_out

Bytes (by hand): every element read once and written once, 2 * (T/cp) * D * 2 B (the
token kernels also read cu_seqlens, 36 B: not counted; torch's maps, 8 B per row or
column: not counted either). Time: triton.testing.do_bench median (ms). % of the H200
copy ceiling 4.27 TB/s, and of a device-to-device copy of the same bytes measured here.
Bit identity: every kernel output equals the torch path's (torch.equal), outputs poisoned
(NaN) before each checked call.

Configs per kernel: ``default`` (PackCfg.heuristic), with --prev ``prev`` (the defaults before
the rank-table merge / exact token tiles, ledger 2026-11-24 later: ``prev_flags``), with --first
the first design (section kernels one block per 16 rows over all ranks, token kernels a row
gather everywhere), with --sweep the variants of ``SWEEP`` (named flag sets). Every config is
compiled first in a thread pool (tileiras runs as a child process), checked bitwise, then timed
in --reps passes over all configs (default 2: the per-pass %s show the run-to-run noise; ``ms``
is their median). JSON under $OUT (or ./cp_pack_check.json), a short table last.

    python3 benchmarks/cp_pack_check.py [--quick] [--sweep] [--first] [--prev] [--reps 2] [--cps 8,4,2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from _gpu import bench as bench_ms  # do_bench median ms

from tilekernels.cp import bench as cpb
from tilekernels.cp import cutile_pack as ck
from tilekernels.cp import perm

CEIL_TBS = 4.27
SECTIONS = (2048, 2048, 4096, 4096, 32, 32)
SECTION_KERNELS = ("split", "merge")
# named flag sets beside the default (--sweep), per kernel kind
# (session 6: the merge's persistent grid / rank-fastest / bid-major block orders, the narrow
# b|a pieces as one dense permuted tile, split occupancy hints, token latency hints; the earlier
# sweeps are in git history and the ledger)
SWEEP = {  # merge-only flags (PERSIST, QFIRST) on the split time the default again: dropped as duplicates
    "section": {
        "p2": dict(PERSIST=2, QFIRST=False), "qf": dict(QFIRST=True, PERSIST=0), "bid": dict(QFIRST=False, PERSIST=0),
        "grp": dict(GROUP=True), "qf-m16": dict(QFIRST=True, PERSIST=0, MBT=16, MBD=0),
        "p2-m32": dict(PERSIST=2, QFIRST=False, MBT=32), "o4": dict(OCC=4), "o8": dict(OCC=8),
    },
    "token": {"lat0": dict(LAT=0), "lat8": dict(LAT=8), "lat4": dict(LAT=4), "lat10": dict(LAT=10),
              "lat8-o1": dict(LAT=8, TOCC=1)},
}
SWEEP_SHORT = {"section": ("p2", "qf", "bid"), "token": ("lat0", "lat8")}  # at the other cps
SWEEP_SKIP = {"merge": ("o4", "o8"), "split": ("grp",)}  # not timed for that kernel (split grp: 71% in session 6)


def prev_flags(cp: int, elt: int = 2) -> dict:
    """The heuristic's choices before the rank-table merge and exact 1 KiB token tiles (ledger
    2026-11-24 later): per-thread merge loads of 4 rows (odd rows) / 16, padded 512-byte
    (128-word) token tiles of 32 rows (16 above 8 KiB rows)."""
    row = sum(w // cp for w in SECTIONS) * elt
    odd = row % 32 != 0
    return dict(BT=8, MBT=4 if odd else 16, MBD=0, DYNQ=False, TBT=32 if row <= 8192 else 16, TBD=128,
                TOCC=2 if odd else 0, EXACT=False)


FIRST = dict(QGRID=False, RUNS=False, BT=16, MBT=16, TBT=32, TBD=64, TOCC=0)


def poison(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan"))


def _wait_for(path: str, limit_s: float = 150.0) -> None:
    """Block until ``path`` exists (another job on this GPU, e.g. the tests, has finished: the
    compiles overlap it, the timings do not), at most ``limit_s`` seconds."""
    t0 = time.time()
    while path and not os.path.exists(path) and time.time() - t0 < limit_s:
        time.sleep(0.5)
    if path:
        print(f"waited {time.time() - t0:.1f} s for {path} ({'there' if os.path.exists(path) else 'not there'})",
              flush=True)


def one_cp(cp: int, T: int, dev, sweep: str, first: bool, prev: bool = False, reps: int = 2,
           wait_for: str = "") -> list[dict]:
    """sweep: "" (none), "short" (SWEEP_SHORT) or "full" (SWEEP); prev: the ``prev`` configs too;
    reps: timing passes over every config (``ms``, ``ms_reps``: one median per pass)."""
    D = sum(SECTIONS)
    dc, tl = D // cp, T // cp
    cu = cpb.cu_seqlens(T, 8, 16, dev)                      # int32 on the GPU
    tp, ti = perm.token_perm(cu, cp, total=T)
    fp, fi = perm.feature_perm(SECTIONS, cp, dev)
    x_cp = torch.randn(tl, D, device=dev).to(torch.bfloat16)
    x_hp = torch.randn(T, dc, device=dev).to(torch.bfloat16)
    recv3 = torch.randn(cp, tl, dc, device=dev).to(torch.bfloat16)
    rows = torch.arange(tl, device=dev)
    nbytes = 2 * tl * D * 2

    def torch_split():
        return x_cp[rows[None, :, None], fp.view(cp, 1, dc)]

    def torch_natural(out):
        return torch.index_select(x_hp, 0, ti, out=out)

    def torch_rank_major():
        return x_hp.index_select(0, tp)

    def torch_merge(out):
        return torch.ops.aten.index.Tensor_out(recv3, [(fi // dc)[None, :], rows[:, None], (fi % dc)[None, :]],
                                               out=out)

    out_hp = torch.empty(T, dc, device=dev, dtype=torch.bfloat16)
    out_cp = torch.empty(tl, D, device=dev, dtype=torch.bfloat16)
    send3 = torch.empty(cp, tl, dc, device=dev, dtype=torch.bfloat16)
    cases = {
        "split": (lambda cfg: ck.split_sections_into(x_cp, send3, SECTIONS, cfg), send3, torch_split),
        "to_natural": (lambda cfg: ck.to_natural_into(x_hp, cu, cp, out_hp, SECTIONS, cfg), out_hp,
                       lambda: torch_natural(torch.empty_like(out_hp))),
        "to_rank_major": (lambda cfg: ck.to_rank_major_into(x_hp, cu, cp, out_hp, SECTIONS, cfg), out_hp,
                          torch_rank_major),
        "merge": (lambda cfg: ck.merge_sections_into(recv3, out_cp, SECTIONS, cfg), out_cp,
                  lambda: torch_merge(torch.empty_like(out_cp))),
    }
    H = ck.PackCfg.heuristic
    base = H(SECTIONS, cp, 2)
    labelled = {}  # kernel -> [(label, cfg)], the default first, duplicates of it dropped
    for name in cases:
        kind = "section" if name in SECTION_KERNELS else "token"
        cfgs = [("default", base)] + ([("prev", H(SECTIONS, cp, 2, **prev_flags(cp)))] if prev else [])
        if first:
            cfgs.append(("first", H(SECTIONS, cp, 2, **FIRST)))
        if sweep:
            cfgs += [(lab, H(SECTIONS, cp, 2, **fl)) for lab, fl in SWEEP[kind].items()
                     if (sweep == "full" or lab in SWEEP_SHORT[kind]) and lab not in SWEEP_SKIP.get(name, ())]
        seen, keep = set(), []
        for lab, cfg in cfgs:
            key = _kernel_key(name, cfg)
            if key not in seen:
                seen.add(key)
                keep.append((lab, cfg))
        labelled[name] = keep
    # compile every config first, in parallel (outputs are overwritten by the checked runs below)
    t0 = time.time()

    def compile_one(job):
        cases[job[0]][0](job[2])
        print(f"cp {cp} {job[0]} {job[1]} compiled and launched at {time.time() - t0:.1f} s", flush=True)

    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(compile_one, [(name, lab, cfg) for name, lst in labelled.items() for lab, cfg in lst]))
    torch.cuda.synchronize()
    _wait_for(wait_for)
    src_copy = torch.empty(nbytes // 4, dtype=torch.bfloat16, device=dev).normal_()
    dst_copy = torch.empty_like(src_copy)
    copy_ms = bench_ms(lambda: dst_copy.copy_(src_copy))
    recs = []
    wants = {}
    for name, (run, out, ref) in cases.items():
        wants[name] = (ref(), bench_ms(ref))
        for label, cfg in labelled[name]:
            poison(out)
            run(cfg)
            torch.cuda.synchronize()
            same = bool(torch.equal(out, wants[name][0]))
            recs.append((name, label, cfg, same))
    times: dict = {}
    for _ in range(reps):  # passes over every config: the spread shows the run-to-run noise
        for name, label, cfg, _same in recs:
            run = cases[name][0]
            times.setdefault((name, label), []).append(
                bench_ms(lambda: run(cfg), rep=200 if label in ("default", "prev") else 100))
    done, recs = recs, []
    for name, label, cfg, same in done:
        torch_ms = wants[name][1]
        ms_reps = times[(name, label)]
        ms = statistics.median(ms_reps)
        bt, bd = ((cfg.BT if name == "split" else cfg.MBT or cfg.BT, cfg.BD) if name in SECTION_KERNELS
                  else cfg.token_tile)
        rec = dict(cp=cp, kernel=name, label=label, T=T, D=D, BT=bt, BD=bd,
                   OCC=cfg.OCC if name in SECTION_KERNELS else cfg.TOCC or cfg.OCC,
                   cfg={k: v for k, v in vars(cfg).items() if k not in ("parts", "src", "dst")},
                   bytes=nbytes, ms=ms, ms_reps=ms_reps, tbs=nbytes / ms / 1e9, torch_ms=torch_ms,
                   torch_tbs=nbytes / torch_ms / 1e9, copy_ms=copy_ms, copy_tbs=nbytes / copy_ms / 1e9,
                   bitwise=same, default=label == "default")
        rec["pct_ceiling"] = 100 * rec["tbs"] / CEIL_TBS
        rec["pct_ceiling_reps"] = [100 * nbytes / m / 1e9 / CEIL_TBS for m in ms_reps]
        rec["torch_pct_ceiling"] = 100 * rec["torch_tbs"] / CEIL_TBS
        rec["pct_copy_measured"] = 100 * copy_ms / ms
        recs.append(rec)
        print(json.dumps(rec), flush=True)
    return recs


def _kernel_key(name: str, cfg) -> tuple:
    """What one kernel's code and launch depend on (configs equal here time the same kernel)."""
    sec = ("QGRID", "FLAT", "TMA", "SMALL_TMA", "NARROW", "OCC", "BD", "group") + (
        ("DYNQ", "MBD", "PERSIST", "QFIRST") if name == "merge" else ())
    tok = ("WORDS", "ROWWISE", "RUNS", "VIEW", "EGATHER", "EXACT", "TOCC", "OCC", "BK", "NOCHK", "LAT")
    if name in SECTION_KERNELS:
        rows = cfg.BT if name == "split" else cfg.MBT or cfg.BT
        return (rows,) + tuple(getattr(cfg, f) for f in sec)
    return cfg.token_tile + tuple(getattr(cfg, f) for f in tok)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cps", default="2,4,8")
    ap.add_argument("--sweep", action="store_true", help="the SWEEP variants beside default and prev")
    ap.add_argument("--sweep-cps", default="8", help="the cps that get the whole SWEEP (others: SWEEP_SHORT)")
    ap.add_argument("--first", action="store_true", help="the first design beside the default")
    ap.add_argument("--prev", action="store_true", help="the session-4 defaults (prev_flags) beside the default")
    ap.add_argument("--reps", type=int, default=2, help="timing passes over every config")
    ap.add_argument("--wait-for", default="", help="time only once this file exists (compile before)")
    a = ap.parse_args()
    dev = torch.device("cuda")
    T = 4096 if a.quick else 65536
    recs = []
    for cp in [int(c) for c in a.cps.split(",")]:
        full = str(cp) in a.sweep_cps.split(",")
        recs += one_cp(cp, T, dev, sweep=("full" if full else "short") if a.sweep and not a.quick else "",
                       first=a.first, prev=a.prev, reps=a.reps, wait_for=a.wait_for)
    out_dir = os.environ.get("OUT", ".")
    with open(os.path.join(out_dir, "cp_pack_check.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, sections=SECTIONS,
                       ceiling_tbs=CEIL_TBS, records=recs), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}  T={T} D={sum(SECTIONS)} bf16  ceiling {CEIL_TBS} TB/s")
    print(f"{'cp':>2} {'kernel':<14}{'config':<11}{'BT':>4}{'BD':>5}{'occ':>4}{'ms':>8}{'TB/s':>6}{'%ceil':>6}"
          f"{'  %ceil per pass':<17}{'%copy':>6}{'torch ms':>9}{'%ceil':>6}  bitwise")
    for r in recs:
        per = "/".join(f"{p:.1f}" for p in r["pct_ceiling_reps"])
        print(f"{r['cp']:>2} {r['kernel']:<14}{r['label']:<11}{r['BT']:>4}{r['BD']:>5}{r['OCC'] or '-':>4}"
              f"{r['ms']:>8.4f}{r['tbs']:>6.2f}{r['pct_ceiling']:>6.1f}  {per:<15}{r['pct_copy_measured']:>6.1f}"
              f"{r['torch_ms']:>9.3f}{r['torch_pct_ceiling']:>6.1f}  {r['bitwise']}")
    return 0 if all(r["bitwise"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
