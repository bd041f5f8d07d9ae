"""h_post_bda's cute backward with fp32 h and with bf16 h, for Nsight Compute: why is the fp32-h backward ~10 us
slower (H200, T=32768, n=4, C=7168; nvidia-h200-mhc-cutile.md, sessions 14 and 20)? Runs each dtype's bwd_into
3 times (fp32 h first), e.g.
    ncu --kernel-name regex:_bwd_kernel --launch-skip 1 --launch-count 4 --metrics <list> \\
        python3 benchmarks/probes/post_bda_h_dtype_ncu.py
(launches 1-2 fp32 h after the first, 4-5 bf16 h after its first: with --launch-skip 1 --launch-count 4 the
profiled ones are fp32, fp32, bf16-first, bf16)."""
from __future__ import annotations

import torch

from tilekernels.mhc import cute_post_bda as cp

T, n, C = 32768, 4, 7168
BF = torch.bfloat16

if __name__ == "__main__":
    for hd in (torch.float32, BF):
        g = lambda *s, dt=BF: torch.randn(*s, device="cuda").to(dt)  # noqa: E731
        ins = (g(T, n, n, dt=hd) * 0.5, g(T, n, C), g(T, n, dt=hd), g(T, C), g(C))
        dout = g(T, n, C)
        grads = [torch.empty_like(t) for t in ins]
        for _ in range(3):
            cp.bwd_into(dout, *ins, *grads)
        torch.cuda.synchronize()
        del ins, dout, grads
        torch.cuda.empty_cache()
