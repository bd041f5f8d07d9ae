"""tilekernels._cutile.workspace: the per-(tag, device, stream) kernel workspace cache
(gdn_decode's counters, the Sinkhorn backward's scratch); Launch.run's refusal of tensors off CUDA."""
from __future__ import annotations

import pytest
import torch

from tilekernels._cutile import may_keep, workspace, workspace_reuse

META = torch.device("meta")


def test_scratch_off_cuda_is_a_plain_allocation():
    """Off CUDA nothing is cached: the scratch is a plain allocation."""
    a = workspace("test", (2, 3), torch.float32, META)
    b = workspace("test", (2, 3), torch.float32, META)
    assert a is not b and a.device == META
    assert may_keep(torch.zeros(3)) and may_keep(a)   # off CUDA any tensor may be kept (no pools)


class _FakeCuda:
    """Stands in for a CUDA tensor at ``ptr`` (what may_keep reads of one: its device and its storage's address)."""

    def __init__(self, ptr: int):
        self.device, self.ptr = torch.device("cuda", 0), ptr

    def untyped_storage(self):
        return self

    def data_ptr(self):
        return self.ptr


def test_may_keep_reads_the_segment_pool(monkeypatch):
    """The rule on the CPU (torch.cuda's two queries stubbed): a CUDA tensor may be kept only outside a capture and
    inside a segment of the default pool (0, 0); a graph's or MemPool's segment, or none found, means no."""
    from tilekernels import _glue

    segs = [{"address": 1000, "total_size": 100, "segment_pool_id": (0, 0)},
            {"address": 2000, "total_size": 100, "segment_pool_id": (1, 0)},
            {"address": 3000, "total_size": 100, "segment_pool_id": (0, 3)}]
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: segs)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    assert _glue.may_keep(_FakeCuda(1000)) and _glue.may_keep(_FakeCuda(1099))
    assert not _glue.may_keep(_FakeCuda(1100))    # past the default segment's end, in no segment
    assert not _glue.may_keep(_FakeCuda(2050))    # a CUDA graph's pool
    assert not _glue.may_keep(_FakeCuda(3000))    # a torch.cuda.MemPool
    capturing[0] = True
    assert not _glue.may_keep(_FakeCuda(1000))    # made during a capture


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_workspace_reused_grown_and_fresh_under_capture():
    """Eager calls on one stream share a tag's buffer (a view of its first elements), a bigger
    request replaces it, a zero workspace starts zeroed, and a capture gets its own tensor."""
    dev = torch.device("cuda")
    a = workspace("t-reuse", (4, 8), torch.float32, dev)
    b = workspace("t-reuse", (2, 8), torch.float32, dev)
    assert b.data_ptr() == a.data_ptr() and b.shape == (2, 8) and b.is_contiguous()
    c = workspace("t-reuse", (8, 8), torch.float32, dev)
    assert c.shape == (8, 8) and workspace("t-reuse", (8, 8), torch.float32, dev).data_ptr() == c.data_ptr()
    z = workspace("t-zero", (5,), torch.int32, dev, zero=True)
    assert int(z.abs().sum()) == 0
    with workspace_reuse(False):
        assert workspace("t-reuse", (8, 8), torch.float32, dev).data_ptr() != c.data_ptr()
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        warm = workspace("t-reuse", (8, 8), torch.float32, dev)
    with torch.cuda.graph(g, stream=s):
        inside = workspace("t-reuse", (8, 8), torch.float32, dev)
    assert inside.data_ptr() != warm.data_ptr()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_workspace_not_kept_from_a_private_pool():
    """A buffer allocated while this thread's allocations go to a private pool is handed out but not kept (``may_keep``):
    Inductor's CUDA-graph warm-up (torch.compile mode="reduce-overhead") routes them to the graph's pool without
    capturing, and a kept block there failed its live-allocation check (session 54: mhc_sinkhorn's cuTile backward).
    Here a ``torch.cuda.MemPool`` routes them (the same allocator path); a default-pool buffer is still kept."""
    from tilekernels import _cutile

    dev = torch.device("cuda")
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = workspace("t-pool", (1000,), torch.float32, dev)
        b = workspace("t-pool", (1000,), torch.float32, dev)
    assert not any(k[0] == "t-pool" for k in _cutile._WORKSPACES)
    assert a.data_ptr() != b.data_ptr()
    del a, b
    c = workspace("t-pool", (1000,), torch.float32, dev)
    assert workspace("t-pool", (10,), torch.float32, dev).data_ptr() == c.data_ptr()
    assert any(k[0] == "t-pool" for k in _cutile._WORKSPACES)


def test_launch_refuses_tensors_off_cuda():
    """A cuTile Launch given CPU tensors (an entry called directly with a forced backend: the registry refuses
    such a call before) names the kernel and the device, as _cute's Launch.run does, instead of failing inside
    torch (an AttributeError about _cuda_getCurrentRawStream on a CPU build)."""
    pytest.importorskip("cuda.tile")
    from tilekernels._cutile import Launch
    from tilekernels.mhc import cutile_sinkhorn as sk

    x = torch.randn(4, 3, 3)
    with pytest.raises(ValueError, match=r"mhc_sk_fwd: launched with a tensor on cpu, not on a CUDA device"):
        Launch(sk.mhc_sk_fwd, (1,), (x, torch.empty_like(x))).run()
