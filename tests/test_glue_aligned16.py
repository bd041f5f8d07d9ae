"""``tilekernels._glue.aligned16`` on the CPU (pinned by a mutation audit).

The GPU backends (CuTe DSL and cuTile kernels: mhc, moe, gdn) pass every vector- or TMA-accessed tensor through
it: a tensor whose address is not a multiple of 16 bytes (a view offset into its allocation: x[1:] of a flat
buffer) must come back as an aligned copy with the same values, since a 16-byte vector load from it faults or
reads the wrong bytes; an aligned tensor must come back as itself (no copy: the kernels' host cost), and None
(an absent optional tensor) as None. test_registry_hot_path's misaligned-input test reaches it on a GPU only."""
from __future__ import annotations

import pytest
import torch

from tilekernels._glue import aligned16


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_a_misaligned_view_becomes_an_aligned_copy(offset):
    """Offsets of 4, 8 and 12 bytes into a float32 buffer (8: aligned for 8-byte accesses, not for 16)."""
    buf = torch.arange(64, dtype=torch.float32)
    assert buf.data_ptr() % 16 == 0
    view = buf[offset:offset + 32]
    assert view.is_contiguous() and view.data_ptr() % 16 == 4 * offset
    got = aligned16(view)
    assert got.data_ptr() % 16 == 0
    assert got.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr(), "a copy, not the view"
    assert torch.equal(got, view) and got.dtype == view.dtype and got.shape == view.shape


def test_an_aligned_tensor_and_none_pass_through():
    buf = torch.arange(64, dtype=torch.bfloat16)
    for t in (buf, buf[8:40], buf.view(8, 8)[2:]):  # 16-byte offsets: aligned views stay views
        assert t.data_ptr() % 16 == 0
        assert aligned16(t) is t
    assert aligned16(None) is None
