"""Helpers the mHC tests share (not a test module): random inputs, the float64
gradient comparison and an independent loop formulation of Sinkhorn."""
import pytest
import torch

from tilekernels.testing import assert_close, upcast

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64


def on_gpu(fn):
    """Mark a test ``gpu`` and skip it where there is no CUDA device."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(fn))


def case_id(c: dict) -> str:
    """A pytest id of a dict of case fields: T1000-n4-C2560-xfloat32."""
    return "-".join(f"{k}{str(v).removeprefix('torch.')}" for k, v in c.items())


BIG_TOKENS = 16384


def gpu_cases(cases: list[dict]) -> list:
    """pytest params of case dicts; those with T or M >= BIG_TOKENS (the headline T = 32768, whose
    float64 references take tens of GB) are marked ``big_gpu``, so under pytest-xdist they run one
    at a time (tests/conftest.py's lock)."""
    return [pytest.param(c, id=case_id(c), marks=[pytest.mark.big_gpu] if max(c.get("T", 0), c.get("M", 0))
                         >= BIG_TOKENS else []) for c in cases]


def kernel_names(fn) -> str:
    """The names of what ``fn()`` runs on the GPU as torch.profiler records it, space-separated ("" where the
    profiler records nothing: see ``skip_if_unprofiled``)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events())


def skip_if_unprofiled(names: str) -> None:
    """Skip a kernel-list assertion the profiler cannot serve: under compute-sanitizer CUPTI is taken
    (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) and torch.profiler records no event at all. Called after the
    test's numeric checks, which still run there; outside a sanitizer every profiled call records its kernels."""
    if not names:
        pytest.skip("torch.profiler recorded no event (CUPTI unavailable, e.g. under compute-sanitizer)")


def rand(*shape, dtype=F32, scale=1.0):
    return (torch.randn(*shape) * scale).to(dtype)


def grads_vs_float64(fn, ref64, inputs, names, **params):
    """Backprop random cotangents through ``fn(*inputs, **params)`` (every floating input
    requires grad) and compare each input's gradient, in its own dtype, with float64
    autograd through ``ref64`` on upcast copies. Returns the op's outputs."""
    ins = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    outs = fn(*ins, **params)
    outs = outs if isinstance(outs, tuple) else (outs,)
    cots = [rand(*o.shape, dtype=o.dtype) for o in outs]
    torch.autograd.backward(outs, cots)
    ins64 = [None if t is None else upcast(t).requires_grad_() for t in inputs]
    outs64 = ref64(*ins64, **params)
    outs64 = outs64 if isinstance(outs64, tuple) else (outs64,)
    torch.autograd.backward(outs64, [upcast(c) for c in cots])
    for name, a, b in zip(names, ins, ins64):
        if a is None:
            continue
        assert a.grad is not None and a.grad.dtype == a.dtype, f"d{name}: {a.grad!r}"
        assert_close(a.grad, b.grad, what=f"d{name}")
    return outs

def loop64(logits, iters=20, eps=1e-6):
    """Independent formulation: per matrix, element-wise Python sums, float64 (differentiable)."""
    mats = []
    for t in range(logits.shape[0]):
        m = logits[t].double()
        n = m.shape[0]
        m = torch.stack([torch.exp(m[i] - m[i].max()) for i in range(n)])
        for _ in range(iters):
            m = torch.stack([m[i] / (sum(m[i, j] for j in range(n)) + eps) for i in range(n)])
            m = torch.stack([m[:, j] / (sum(m[i, j] for i in range(n)) + eps) for j in range(n)], dim=1)
        mats.append(m)
    return torch.stack(mats) if mats else logits.double() * 0  # T = 0: empty, still in the graph
