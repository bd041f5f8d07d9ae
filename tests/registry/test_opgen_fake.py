"""The generated functional custom ops' fake implementations (tilekernels/_opgen.py, ``_Gen._alloc_op``), on the
CPU (pinned by a mutation audit).

``torch.library.opcheck`` (test_opgen.py) compares an op's fake implementation with its real one on the same
device, so a fake output on the wrong device passes it; ``fake_mode_check`` (registry_gpu_helpers) compares shape,
dtype and device only. Here the functional op ``tilekernels::<op>`` runs on meta inputs (its fake implementation:
what FakeTensorMode, torch.compile's tracing and a memory estimator see) and its outputs must be the real CPU
call's, shape, strides and dtype, on the inputs' device (meta): a fake output allocated on another device than the
inputs' would send a traced graph's later ops to the wrong device."""
from __future__ import annotations

import pytest
import torch

import registry
from test_opgen import _cases


@pytest.mark.parametrize("case", [c for c in _cases(with_grads=False)
                                  if registry.get(c.values[0].op).entry.gen.fwd_alloc_op is not None])
def test_functional_op_fake_outputs_match_the_real_ones(case):
    op = registry.get(case.op)
    gen = op.entry.gen
    args, params = case.make(case.dims, torch.device("cpu"))
    bound = op.bind(*args, **params)
    tensors, ps = list(bound.args()), [bound.params[p] for p in gen.params]
    real = gen.fwd_alloc_op(*[t.clone() if isinstance(t, torch.Tensor) else t for t in tensors], *ps, "torch")
    meta = gen.fwd_alloc_op(*[t.to("meta") if isinstance(t, torch.Tensor) else t for t in tensors], *ps, "torch")
    assert len(meta) == len(real)
    for i, (m, r) in enumerate(zip(meta, real)):
        assert m.device.type == "meta", (case.op, i, m.device)
        assert (m.shape, m.stride(), m.dtype) == (r.shape, r.stride(), r.dtype), (case.op, i)
