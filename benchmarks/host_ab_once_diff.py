"""A/B of the host cost of Sinkhorn fwd + autograd bwd through the registry, with the
backward wrapped by once_differentiable (as shipped) and without it, alternating in
one process (host noise differs between GPU hosts); then a CPU profile of 50 calls.
GPU host: python3 benchmarks/host_ab_once_diff.py"""
import time, torch, registry
from tilekernels.mhc import ops
op = registry.get("mhc_sinkhorn")
lg = torch.randn(32768, 4, 4, device="cuda", requires_grad=True); d = torch.randn_like(lg)
def per(fn, n=1000):
    for _ in range(30): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6
f = lambda: torch.autograd.backward(op(lg, iters=20, eps=1e-6), d)
wrapped = ops._Sinkhorn.backward
plain = wrapped.__wrapped__
for rnd in range(3):
    ops._Sinkhorn.backward = staticmethod(wrapped); a = per(f)
    ops._Sinkhorn.backward = staticmethod(plain); b = per(f)
    print(f"round {rnd}: once_differentiable {a:.1f} us, plain {b:.1f} us", flush=True)
ops._Sinkhorn.backward = staticmethod(wrapped)
import torch.profiler as P
with P.profile(activities=[P.ProfilerActivity.CPU]) as prof:
    for _ in range(50): f()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=14))

import cProfile  # noqa: E402
import pstats  # noqa: E402

pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    f()
torch.cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
