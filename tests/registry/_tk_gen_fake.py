"""A generated op (``tilekernels._opgen.define``, the path every real op's entry takes) of a synthetic spec, for
registry tests that need what no real op has: a non-differentiable op with a float output computed from a float
input (the real forward-only ops write float8 / integer outputs, which never carry a gradient, or refuse an input
that requires grad). Its torch kernel writes ``out.copy_(x * scale)``, which records a graph unless grad mode is
off: an eager call must run it with grad mode off."""
import torch

from registry.kernels import kernel
from specs.schema import Backend, Dim, OpSpec, Param, TensorSpec
from tilekernels._opgen import define

NODIFF = OpSpec(
    name="tk_test_nodiff_scale", family="mhc", doc="out = x * scale, not differentiable (a registry test op)",
    dims=[Dim(name="T"), Dim(name="C")],
    inputs=[TensorSpec(name="x", shape=["T", "C"], dtypes=["float32", "float64"])],
    outputs=[TensorSpec(name="out", role="out", shape=["T", "C"], dtypes="like:x")],
    params=[Param(name="scale", type="float", default=2.0)],
    differentiable=False,
    reference="_tk_gen_fake:reference", entry="_tk_gen_fake:nodiff_scale",
    backends=[Backend(name="torch", module="_tk_gen_fake", passes=["fwd"])],
)


def reference(x, *, scale=2.0):
    return x * scale


nodiff_scale = define(NODIFF)


@kernel(NODIFF.name, "torch", "fwd")
def _fwd(x, out, scale):
    out.copy_(x * scale)
