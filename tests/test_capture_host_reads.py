"""The torch backends' host reads of m_splits / cu_seqlens against OPS.md's hot path (a call whose tensors are on a GPU
never waits for the GPU; every op but the CP collectives captures in a CUDA graph; m_splits and cu_seqlens may come
on the CPU). Found by session 70's audit:

* The MoE torch backend loops over the groups, so it reads m_splits on the host. Inside a CUDA-graph capture a CPU
  m_splits' values were fixed in the graph (replays after an in-place change used the old splits, silently) and a
  GPU one failed with a raw capture error. Now both refuse by name (the GPU backends read m_splits on the device).
* The GDN torch backend copied a CPU cu_seqlens with a blocking copy (a stream sync eager, a raw CUDA error in a
  capture). Now the copy is non-blocking and a capture refuses the CPU cu_seqlens by name (`_glue.on_device`).
  (The CP collectives' cached plans keep their blocking copy, once per new cu_seqlens value: a cached tensor's
  non-blocking copy would have no order with a use on another stream. The collectives do not capture: OPS.md.)

CPU tests patch the capture flag (the refusal comes before any launch); GPU tests run a real capture and the eager
calls under sync-debug "error"."""
import pytest
import torch

import registry
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


def test_gdn_torch_backend_refuses_a_cpu_cu_seqlens_in_a_capture(capturing, monkeypatch):
    """packed() hands a CPU cu_seqlens to _glue.on_device, named for the op, which refuses it for a CUDA target
    inside a capture (before any copy: no GPU needed here); meta stands in for mixed's GPU in the second part."""
    from tilekernels import _glue

    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"gdn_pre_gated \(torch backend\): cu_seqlens: a CUDA-graph capture"):
        _glue.on_device(cu, torch.device("cuda"), "gdn_pre_gated (torch backend): cu_seqlens")
    seen = []
    monkeypatch.setattr(gref, "on_device", lambda t, dev, what: seen.append(what) or t.to(dev))
    gref.packed(torch.empty(9, 8, device="meta"), cu)
    assert seen == ["gdn_pre_gated (torch backend): cu_seqlens"]


def test_eager_calls_unchanged_by_the_guards():
    """Outside a capture the same calls run (CPU), and the GDN reference's cu_seqlens is int64 on mixed's device."""
    assert GL(*_linear_args("cpu", "cpu"), backend="torch").shape == (96, 32)
    assert MLP(*_mlp_args("cpu", "cpu"), backend="torch").shape == (64, 256)
    _, cu = gref.packed(torch.empty(9, 8), torch.tensor([0, 4, 9], dtype=torch.int32))
    assert cu.dtype == torch.int64 and cu.tolist() == [0, 4, 9]
    # meta inputs with a CPU cu_seqlens (the form the spec takes for shape propagation): on_device asks the capture
    # state only for a CUDA target (a CPU-only torch raises on that question)
    outs = PRE(*_pre_args("meta"), cu_seqlens=torch.tensor([0, 4, 4, 9], dtype=torch.int32), Hk=Hk, dk=dk, dv=dv,
               backend="torch")
    assert all(o.device.type == "meta" for o in outs) and outs[0].shape[0] == 9


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
