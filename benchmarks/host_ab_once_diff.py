"""A/B of the host cost of Sinkhorn fwd + autograd bwd through the registry, with the
backward wrapped by once_differentiable (as shipped) and without it, alternating in
one process (host noise differs between GPU hosts); then a CPU profile of 50 calls.
GPU host: python3 benchmarks/host_ab_once_diff.py"""
import os, sys, torch, registry
from tilekernels.mhc import ops
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _host import cprofile_top, per_call_us
op = registry.get("mhc_sinkhorn")
lg = torch.randn(32768, 4, 4, device="cuda", requires_grad=True); d = torch.randn_like(lg)
def per(fn):
    return per_call_us(fn, n=1000, warmup=30)
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

print(cprofile_top(f, 200, top=22))
