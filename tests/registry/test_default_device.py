"""A caller's default device (``torch.set_default_device``, ``with torch.device("cuda"):`` around a model)
does not leak into the ops: every tensor the registry, the references and the glue create names its
device. Checked with the meta device as the default (a tensor made without a device lands there and
the call fails or differs), on every family's CPU bench case, forward and backward."""
from __future__ import annotations

import importlib

import pytest
import torch

import registry
from registry_gpu_helpers import _outs
from tilekernels.testing import assert_close

CASES = [c for fam in ("mhc", "moe", "gdn", "cp") for c in importlib.import_module(f"tilekernels.{fam}.bench").cases("cpu")]
IDS = [f"{c.op}-{c.variant}" if c.variant else c.op for c in CASES]


def _clear_family_caches():
    from tilekernels.cp import ops as cp_ops

    cp_ops._plan.cache_clear()
    cp_ops._host_cu_on.cache_clear()
    registry.clear_caches()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_default_device_does_not_leak_into_an_op(case):
    op = registry.get(case.op)
    names = [t.name for t in op.spec.inputs]
    args, params = case.make(case.dims, torch.device("cpu"))
    results = []
    for default in (None, "meta"):
        _clear_family_caches()  # the meta call builds its own index maps (cp caches them per value)
        a2 = [a.detach().clone().requires_grad_(n in case.grad_inputs) if isinstance(a, torch.Tensor) else a
              for a, n in zip(args, names)]
        torch.set_default_device(default)
        try:
            out = _outs(op(*a2, **params))
            diff = [o for o in out if o.requires_grad]
            grads = list(torch.autograd.grad(diff, [a for a in a2 if isinstance(a, torch.Tensor) and a.requires_grad],
                                             [torch.full_like(o, 0.5, device="cpu") for o in diff])) if diff else []
        finally:
            torch.set_default_device(None)
        results.append([o.detach() for o in out] + grads)
    for i, (got, want) in enumerate(zip(results[1], results[0])):
        assert got.device.type == "cpu", f"{case.op}: result {i} on {got.device}"
        assert_close(got, want, "exact", what=f"{case.op}: default device meta vs none, output/grad {i}")
