"""One launch of each CP pack/unpack kernel at cp 8 (Qwen3-Next sections, T = 65536, bf16),
first design ("old") and current default: what ``ncu -k regex:cp_`` profiles (issue 13: why
the cp 8 merge read 12% of the copy ceiling). Prints nothing itself.

    ncu -k regex:cp_ --section SpeedOfLight ... python3 benchmarks/probes/cp_pack_ncu.py
"""
from __future__ import annotations

import torch

from tilekernels.cp import bench as cpb
from tilekernels.cp import cutile_pack as ck

SECTIONS = (2048, 2048, 4096, 4096, 32, 32)


def main(cp: int = 8, T: int = 65536) -> None:
    dev = torch.device("cuda")
    D = sum(SECTIONS)
    dc, tl = D // cp, T // cp
    cu = cpb.cu_seqlens(T, 8, 16, dev)
    x_cp = torch.randn(tl, D, device=dev).to(torch.bfloat16)
    x_hp = torch.randn(T, dc, device=dev).to(torch.bfloat16)
    buf = torch.empty(cp, tl, dc, device=dev, dtype=torch.bfloat16)
    out_hp = torch.empty_like(x_hp)
    for cfg in (ck.PackCfg.heuristic(SECTIONS, cp, 2, QGRID=False, RUNS=False), ck.PackCfg.heuristic(SECTIONS, cp, 2)):
        ck.split_sections_into(x_cp, buf, SECTIONS, cfg)
        ck.merge_sections_into(buf, x_cp, SECTIONS, cfg)
        ck.to_natural_into(x_hp, cu, cp, out_hp, SECTIONS, cfg)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
