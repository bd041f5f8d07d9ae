"""grouped_linear mxfp8 forward on the cute kernels at N % 32 != 0 (session 73: the default GEMM route (predq, then
torch._grouped_mm) ran every N here correct on an H100; the dq and cute bf16-output routes need N % 32 / % 8, so the
backend keeps its limit: moe.md). Calls the cute fwd kernel directly (output
poisoned) against the float64 reference; prints rel err and unwritten (NaN) elements per (N, K)."""
import torch

from tilekernels.moe import cute_kernels as ck, reference as ref
from tilekernels.testing import rel_err

torch.manual_seed(0)
for N in (8, 36, 40, 72, 100, 96):
    for K, splits in ((96, [0, 1, 31, 130, 0]), (160, [7, 0, 300, 33])):
        M, G = sum(splits), len(splits)
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        w = (torch.randn(G, N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
        m = torch.tensor(splits, dtype=torch.int64)
        y = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        try:
            ck._grouped_linear_fwd(x, w, m, y, "mxfp8")
            torch.cuda.synchronize()
            want = ref.grouped_linear(x.double(), w.double(), m, "mxfp8")
            print(f"N={N} K={K} rel_err={rel_err(y, want):.3e} nan={torch.isnan(y).sum().item()}")
        except Exception as e:
            print(f"N={N} K={K} RAISED {type(e).__name__}: {str(e)[:300]}")
