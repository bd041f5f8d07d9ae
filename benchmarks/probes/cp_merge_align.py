"""Why the cp 8 section merge is slow (issue 13): split and merge at cp 8, T = 65536, bf16,
for section layouts that change one thing at a time against Qwen3-Next's
(2048, 2048, 4096, 4096, 32, 32): b|a pieces of 16 bytes (64, 64: dc = 1552, rows of 3104 B,
32-B aligned), none (dc = 1536, rows of 3072 B, 1 KiB aligned), and per-rank rows of 3088 B
without narrow pieces (2048, 2048, 4096, 4096, 64: dc = 1544). triton do_bench median ms,
% of the 4.27 TB/s ceiling (bytes read + written). Prints one line per case. Configs: the
heuristic's (the merge through the DYNQ TMA pipeline), and the merge with bid(1) ranks
(per-thread 16-byte loads) of 16 and 4 rows, the previous designs.
"""
from __future__ import annotations

import sys

import torch

sys.path.insert(0, __file__.rsplit("/probes/", 1)[0])
from _gpu import bench  # noqa: E402

from tilekernels.cp import cutile_pack as ck  # noqa: E402

LAYOUTS = [(2048, 2048, 4096, 4096, 32, 32), (2048, 2048, 4096, 4096, 64, 64), (2048, 2048, 4096, 4096),
           (2048, 2048, 4096, 4096, 64)]


def main(cp: int = 8, T: int = 65536) -> None:
    dev = torch.device("cuda")
    tl = T // cp
    for secs in LAYOUTS:
        D = sum(secs)
        dc = D // cp
        x = torch.randn(tl, D, device=dev).to(torch.bfloat16)
        buf = torch.randn(cp, tl, dc, device=dev).to(torch.bfloat16)
        out = torch.empty_like(x)
        nbytes = 2 * tl * D * 2
        for flags in (dict(), dict(DYNQ=False, MBT=16), dict(DYNQ=False, MBT=4),
                      dict(DYNQ=False, MBT=4, FLAT=True)):
            cfg = ck.PackCfg.heuristic(secs, cp, 2, **flags)
            ms_s = bench(lambda: ck.split_sections_into(x, buf, secs, cfg), rep=100)
            ms_m = bench(lambda: ck.merge_sections_into(buf, out, secs, cfg), rep=100)
            print(f"sections {secs} dc={dc} row={dc * 2}B {flags}: split {ms_s:.3f} ms "
                  f"{100 * nbytes / ms_s / 1e9 / 4.27:.1f}%  merge {ms_m:.3f} ms {100 * nbytes / ms_m / 1e9 / 4.27:.1f}%",
                  flush=True)


if __name__ == "__main__":
    main()
