"""The torch backends' host reads of m_splits / cu_seqlens against OPS.md's hot path (a call whose tensors are on a GPU
never waits for the GPU; every op but the CP collectives captures in a CUDA graph; m_splits and cu_seqlens may come
on the CPU). Found by session 70's audit:

* The MoE torch backend loops over the groups, so it reads m_splits on the host. Inside a CUDA-graph capture a CPU
  m_splits' values were fixed in the graph (replays after an in-place change used the old splits, silently) and a
  GPU one failed with a raw capture error. Now both refuse by name (the GPU backends read m_splits on the device).
* The GDN torch backend copied a CPU cu_seqlens with a blocking copy (a stream sync eager, a raw CUDA error in a
  capture); the CP collectives' plans did the same for a CPU cu_seqlens once per new value. Now the copies are
  non-blocking and a capture refuses the CPU cu_seqlens by name (`_glue.on_device`).

CPU tests patch the capture flag (the refusal comes before any launch); GPU tests run a real capture and the eager
calls under sync-debug "error"."""
import pytest
import torch

import registry
from tilekernels.cp import ops as cp_ops
from tilekernels.cp import perm
from tilekernels.gdn import bench as gmk
from tilekernels.gdn import reference as gref

GL = registry.get("grouped_linear")
MLP = registry.get("grouped_mlp_mxfp8")
PRE = registry.get("gdn_pre_gated")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
Hk, Hv, dk, dv, W = 2, 4, 4, 4, 4


def _linear_args(device, m_splits_device):
    x = torch.randn(96, 64, device=device).bfloat16()
    w = torch.randn(3, 32, 64, device=device).bfloat16()
    return x, w, torch.tensor([32, 0, 64], device=m_splits_device)


def _mlp_args(device, m_splits_device):
    x = torch.randn(64, 256, device=device).bfloat16()   # H = F = 256 (the spec's H, F % 256)
    probs = torch.rand(64, device=device)
    fc1 = torch.randn(2, 512, 256, device=device).bfloat16()
    fc2 = torch.randn(2, 256, 256, device=device).bfloat16()
    return x, probs, torch.tensor([32, 32], device=m_splits_device), fc1, fc2


def _pre_args(device):
    w, A, dt = gmk.weights(Hk, Hv, dk, dv, W, dtype=torch.bfloat16, gate_dtype=torch.float32)
    return [t.to(device) for t in (gmk.mixed((9,), Hk, Hv, dk, dv, dtype=torch.bfloat16), w, A, dt)]


@pytest.fixture
def capturing(monkeypatch):
    """torch.cuda as inside a capture (the refusals read only these two)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)


def test_moe_torch_backend_refuses_a_capture(capturing):
    with pytest.raises(RuntimeError, match=r"grouped_linear \(torch backend\): m_splits: expected an eager call"):
        GL(*_linear_args("cpu", "cpu"), backend="torch")
    with pytest.raises(RuntimeError, match=r"grouped_mlp_mxfp8 \(torch backend\): m_splits: expected an eager"):
        MLP(*_mlp_args("cpu", "cpu"), backend="torch")


def test_gdn_torch_backend_refuses_a_cpu_cu_seqlens_in_a_capture(capturing):
    """mixed on another device (meta stands in for the GPU): the CPU cu_seqlens' copy is refused, naming it."""
    mixed = torch.empty(9, 8, device="meta")
    with pytest.raises(RuntimeError, match=r"gdn_pre_gated \(torch backend\): cu_seqlens: a CUDA-graph capture"):
        gref.packed(mixed, torch.tensor([0, 4, 9], dtype=torch.int32))


def test_eager_calls_unchanged_by_the_guards():
    """Outside a capture the same calls run (CPU), and the GDN reference's cu_seqlens is int64 on mixed's device."""
    assert GL(*_linear_args("cpu", "cpu"), backend="torch").shape == (96, 32)
    assert MLP(*_mlp_args("cpu", "cpu"), backend="torch").shape == (64, 256)
    _, cu = gref.packed(torch.empty(9, 8), torch.tensor([0, 4, 9], dtype=torch.int32))
    assert cu.dtype == torch.int64 and cu.tolist() == [0, 4, 9]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("m_dev", ["cpu", "cuda"])
def test_moe_torch_backend_capture_refused_on_the_gpu(m_dev):
    """A real capture: refused by name before anything is launched or read (a GPU m_splits as well: before this it
    was the raw capture error of .tolist())."""
    for op, args, name in ((GL, _linear_args("cuda", m_dev), "grouped_linear"),
                           (MLP, _mlp_args("cuda", m_dev), "grouped_mlp_mxfp8")):
        op(*args, backend="torch")  # eager first
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match=rf"{name} \(torch backend\): m_splits"):
            with torch.cuda.graph(g):
                op(*args, backend="torch")


@pytest.mark.gpu
@needs_gpu
def test_gdn_torch_backend_cpu_cu_seqlens_on_the_gpu():
    """Eager: a CPU cu_seqlens reaches the GPU without a stream sync (sync-debug "error"; it was a blocking copy) and
    gives bitwise the GPU cu_seqlens' outputs; in a capture it is refused by name."""
    a = _pre_args("cuda")
    cu = torch.tensor([0, 4, 4, 9], dtype=torch.int32)
    want = PRE(*a, cu_seqlens=cu.cuda(), Hk=Hk, dk=dk, dv=dv, backend="torch")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = PRE(*a, cu_seqlens=cu, Hk=Hk, dk=dk, dv=dv, backend="torch")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for i, (w, o) in enumerate(zip(want, got)):
        assert torch.equal(w, o), f"output {i}"
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"gdn_pre_gated \(torch backend\): cu_seqlens"):
        with torch.cuda.graph(g):
            PRE(*a, cu_seqlens=cu, Hk=Hk, dk=dk, dv=dv, backend="torch")


@pytest.mark.gpu
@needs_gpu
def test_cp_plans_copy_a_cpu_cu_seqlens_without_a_sync():
    """The collectives' plans from a CPU cu_seqlens (the torch backend's four maps, the cuTile backend's int32 copy)
    reach the GPU without a stream sync (sync-debug "error"; they were blocking copies), equal to the CPU maps."""
    cu, sections, dev = (0, 8, 8, 24), (4, 8), torch.device("cuda")
    cp_ops._plan.cache_clear()
    cp_ops._host_cu_on.cache_clear()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        plan = cp_ops._plan(cu, 2, sections, dev)
        cu_dev = cp_ops._host_cu_on(cu, dev)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    tp, ti = perm.token_perm(torch.tensor(cu), 2)
    fp, fi = perm.feature_perm(sections, 2)
    for name, w in (("token_perm", tp), ("token_inv", ti), ("feature_perm", fp), ("feature_inv", fi)):
        assert torch.equal(getattr(plan, name).cpu(), w), name
    assert cu_dev.dtype == torch.int32 and cu_dev.cpu().tolist() == list(cu)
