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
(NaN) before each checked call. Beside the default config, the first design ("old": section
kernels one block per 16 rows over all ranks, token kernels a row gather for every block) at
every cp; with --sweep a config sweep around the default (rows per block of each kernel,
occupancy hints, send / recv as 2-D rank slices, the token kernels' fallback gather and
slice vs tiled view). JSON under $OUT
(or ./cp_pack_check.json), a short table last.

    python3 benchmarks/cp_pack_check.py [--quick] [--sweep] [--cps 8,4,2]    # --quick: T = 4096
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from _gpu import bench as bench_ms  # do_bench median ms

from tilekernels.cp import bench as cpb
from tilekernels.cp import cutile_pack as ck
from tilekernels.cp import perm

CEIL_TBS = 4.27
SECTIONS = (2048, 2048, 4096, 4096, 32, 32)


def poison(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan"))


def one_cp(cp: int, T: int, dev, sweep: bool) -> list[dict]:
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
    # "old": the first design (ledger 2026-11-24): section kernels one block per 16 rows over
    # all ranks, token kernels a [32 rows, 64 words] row gather for every block
    old = H(SECTIONS, cp, 2, QGRID=False, RUNS=False, BT=16, MBT=16, TBT=32, TBD=64, TOCC=0)
    sweeps = {"section": [old], "token": [old]}
    if sweep:  # around the default: rows per block (split BT, merge MBT, token TBT), occupancy, paths
        sweeps["section"] += [H(SECTIONS, cp, 2, BT=16, MBT=16), H(SECTIONS, cp, 2, MBT=8), H(SECTIONS, cp, 2, MBT=2),
                              H(SECTIONS, cp, 2, MBT=4, FLAT=True), H(SECTIONS, cp, 2, MBT=4, OCC=8)]
        sweeps["token"] += [H(SECTIONS, cp, 2, TBT=16), H(SECTIONS, cp, 2, TBT=64), H(SECTIONS, cp, 2, TOCC=0, OCC=0),
                            H(SECTIONS, cp, 2, TOCC=4), H(SECTIONS, cp, 2, EGATHER=True), H(SECTIONS, cp, 2, VIEW=False)]
    src_copy = torch.empty(nbytes // 4, dtype=torch.bfloat16, device=dev).normal_()
    dst_copy = torch.empty_like(src_copy)
    copy_ms = bench_ms(lambda: dst_copy.copy_(src_copy))
    recs = []
    for name, (run, out, ref) in cases.items():
        want = ref()
        torch_ms = bench_ms(ref)
        cfgs = [base] + sweeps["section" if name in ("split", "merge") else "token"]
        for cfg in cfgs:
            poison(out)
            run(cfg)
            torch.cuda.synchronize()
            same = bool(torch.equal(out, want))
            ms = bench_ms(lambda: run(cfg), rep=200 if cfg in (base, old) else 100)
            bt, bd = ((cfg.BT if name == "split" else cfg.MBT or cfg.BT, cfg.BD) if name in ("split", "merge")
                      else cfg.token_tile)
            rec = dict(cp=cp, kernel=name, T=T, D=D, BT=bt, BD=bd, bds=list(cfg.bds), TMA=cfg.TMA,
                       SMALL_TMA=cfg.SMALL_TMA, NARROW=cfg.NARROW, WORDS=cfg.WORDS, ROWWISE=cfg.ROWWISE,
                       QGRID=cfg.QGRID, RUNS=cfg.RUNS, VIEW=cfg.VIEW, FLAT=cfg.FLAT, EGATHER=cfg.EGATHER,
                       OCC=cfg.OCC if name in ("split", "merge") else cfg.TOCC or cfg.OCC,
                       old=cfg == old,
                       bytes=nbytes,
                       ms=ms, tbs=nbytes / ms / 1e9, torch_ms=torch_ms, torch_tbs=nbytes / torch_ms / 1e9,
                       copy_ms=copy_ms, copy_tbs=nbytes / copy_ms / 1e9, bitwise=same, default=cfg == base)
            rec["pct_ceiling"] = 100 * rec["tbs"] / CEIL_TBS
            rec["torch_pct_ceiling"] = 100 * rec["torch_tbs"] / CEIL_TBS
            rec["pct_copy_measured"] = 100 * copy_ms / ms
            recs.append(rec)
            print(json.dumps(rec), flush=True)
    return recs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cps", default="2,4,8")
    ap.add_argument("--sweep", action="store_true", help="the config sweep beside default and old")
    a = ap.parse_args()
    dev = torch.device("cuda")
    T = 4096 if a.quick else 65536
    recs = []
    for cp in [int(c) for c in a.cps.split(",")]:
        recs += one_cp(cp, T, dev, sweep=a.sweep and not a.quick)
    out_dir = os.environ.get("OUT", ".")
    with open(os.path.join(out_dir, "cp_pack_check.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, sections=SECTIONS,
                       ceiling_tbs=CEIL_TBS, records=recs), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}  T={T} D={sum(SECTIONS)} bf16  ceiling {CEIL_TBS} TB/s")
    print(f"{'cp':>2} {'kernel':<14}{'BT':>4}{'BD':>5}{'var':>5}{'ms':>8}{'TB/s':>7}{'%ceil':>7}{'%copy':>7}"
          f"{'torch ms':>10}{'%ceil':>7}  bitwise")
    for r in recs:
        if r["kernel"] in ("split", "merge"):
            var = ("" if r["TMA"] else "noT") + ("sT" if r["SMALL_TMA"] else "") + ("" if r["NARROW"] else "nt")
            var += "fl" if r["FLAT"] else ""
        else:
            var = ("rw" if r["ROWWISE"] else "") + ("" if r["WORDS"] else "el") + ("" if r["VIEW"] else "sl")
            var += "eg" if r["EGATHER"] else ""
        var += f"o{r['OCC']}" if r["OCC"] else ""
        var = "OLD" if r["old"] else var
        print(f"{r['cp']:>2} {r['kernel']:<14}{r['BT']:>4}{r['BD']:>5}{var or '-':>5}{r['ms']:>8.3f}{r['tbs']:>7.2f}"
              f"{r['pct_ceiling']:>7.1f}{r['pct_copy_measured']:>7.1f}{r['torch_ms']:>10.3f}"
              f"{r['torch_pct_ceiling']:>7.1f}  {r['bitwise']}{'' if r['default'] else '  (old)' if r['old'] else '  (sweep)'}")
    return 0 if all(r["bitwise"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
