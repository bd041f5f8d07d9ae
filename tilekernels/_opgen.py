"""Ops generated from their specs: custom ops, output allocation, autograd, entry.

An op is its spec (``specs/<family>.py``), its torch reference and its kernels.
Everything around them comes from :func:`define`, given the spec and a short
declaration (what the backward saves, scratch outputs the backward needs):

* ``tilekernels::<op>_fwd`` / ``_bwd``: destination-passing
  ``torch.library.custom_op``s whose ``mutates_args`` are the spec's outputs
  (and ``inout`` inputs); their bodies call the kernel the chosen backend
  registered (``registry.kernels``), so torch.compile(fullgraph=True) and
  torch.export see one op per pass;
* ``tilekernels::<op>``: the fwd pass as a functional custom op (allocates and
  returns its outputs), which an eager call runs while a dispatch mode is
  active: a mode that caches results and replays them (selective activation
  checkpointing) needs them among the op's outputs. Not for an op that updates
  an input in place (gdn_decode). ``Op.forward_ops`` names the forward ops for
  a checkpointing policy;
* output allocation from the spec's shape expressions and dtypes (poisoned in
  tests, ``_glue.empty``);
* an ``autograd.Function`` (once-differentiable) whose forward runs the fwd
  pass and saves what the declaration names, and whose backward allocates one
  gradient per differentiable input and runs the bwd pass; for torch.func's grad /
  vjp, the same passes as a setup_context Function (``registry/transforms.py``
  says which transforms the ops take and refuses the rest);
* the functional entry, ``entry(*inputs, <params as keywords>, backend="torch")``,
  which the registry calls with validated inputs (it trusts its inputs);
* :class:`Prepared` calls (``_Gen.prepared``): what an eager call of one metadata recomputes
  every time (allocation plan, params in kernel order, gradient metadata, returned outputs), done
  once; the registry keeps one with each guard pattern and calls it on a hit, so the host cost of
  a repeated eager call is the kernels' launches plus torch's autograd and little else.

Kernel signatures (what every backend registers, destination-passing, params
positional in spec order):

  fwd (*inputs, *outputs, *scratch, *params)
  bwd (*grads of the differentiable outputs, *saved, *grads of the differentiable
       inputs, *params)

Absent optional tensors are passed as None, and so is the gradient of an input whose
dtype cannot carry one (float8 data: grouped_mlp_mxfp8's pre-quantized weights; the
registry refuses such a tensor that requires grad). Eager calls run the kernel directly
(``_glue.run_pass``: no dispatcher cost); traced calls go through the custom op. A
differentiable op's eager call that records no graph (grad mode off, or no input that
requires grad: inference) runs its fwd pass without the autograd.Function, whose
machinery would be most of the host cost of a small op's call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.autograd.forward_ad as _fwad
from torch import Tensor

from registry.kernels import get_kernel, skipped_grads
from registry.transforms import PLAIN_AUTOGRAD, GradLevel, func_transforms, host_tensor, records_graph
from registry.exprs import GRAD_DTYPE_NAMES, GRAD_DTYPES, _fn, evaluate
from specs.schema import OpSpec, TensorSpec

from ._glue import empty, run_kernel, run_pass

_PY = {"int": "int", "float": "float", "bool": "bool", "str": "str", "ints": "list[int]"}


@dataclass(frozen=True)
class Scratch:
    """A tensor the fwd pass writes for the bwd pass only (not returned): shape as
    dim expressions, dtype as in a TensorSpec (a list: float64 in reference mode)."""
    name: str
    shape: tuple
    dtypes: tuple = ("float32", "float64")


@dataclass(frozen=True)
class Decl:
    """What a spec does not say: what the bwd pass gets besides the gradients.

    ``saves``: names of inputs, outputs or scratch tensors, in the bwd kernel's
    order. ``scratch``: fwd-written tensors only the bwd reads. ``present``: an
    optional output exists when this expression over params holds.
    ``dtype_param``: an output whose dtype is named by a str param.
    ``flops``: (fwd, bwd) expressions over dims and params: the matmul-class flops that
    ``torch.utils.flop_counter.FlopCounterMode`` counts for the op's torch reference at those
    shapes (mm / bmm; elementwise math is not counted there either), registered as the flop
    formulas of the op's custom ops, so an MFU reading or a flop-driven checkpointing planner
    sees the same work whether the reference or a kernel runs. The bwd expression may read
    ``d_<input>``: whether that input's gradient is computed (not for pre-quantized weights, nor
    for a skipped one).
    ``skippable``: differentiable inputs whose gradient a backend's bwd kernel may skip when autograd
    does not need it (the input does not require grad: a frozen weight); their ``d_<name>`` is
    optional in the bwd op's schema. Which backends skip: ``registry.kernels.kernel(..., skips=)``.
    """
    saves: tuple = ()
    scratch: tuple = ()
    present: dict = field(default_factory=dict)
    dtype_param: dict = field(default_factory=dict)
    flops: tuple = ()
    skippable: tuple = ()


class _Gen:
    """Everything generated for one op (see the module doc)."""

    def __init__(self, spec: OpSpec, decl: Decl, lib: str = "tilekernels"):
        self.spec, self.decl, self.name = spec, decl, spec.name
        self.ins = [t.name for t in spec.inputs]
        self.outs = [t.name for t in spec.outputs]
        self.params = [p.name for p in spec.params]
        self.inout = [t.name for t in spec.inputs if t.role == "inout"]
        self._inout_at = tuple(self.ins.index(n) for n in self.inout)
        self.diff_in = [t.name for t in spec.inputs if t.differentiable and t.role == "in"]
        self.diff_out = [t.name for t in spec.outputs if t.differentiable]
        self.first_in = spec.inputs[0].name
        self.fwd_op = self._custom_op(f"{lib}::{self.name}_fwd", "fwd", self._fwd_sig())
        # an op that updates an input in place (gdn_decode's states) keeps the destination-passing op under
        # dispatch modes too: a functional op may not return beside its mutations (AOTAutograd refuses it),
        # and a cached replay of a state update would skip the update
        self.fwd_alloc_op = None if self.inout else self._alloc_op(f"{lib}::{self.name}")
        ns = getattr(torch.ops, lib)
        # what a selective-checkpointing policy names to save or recompute this op's forward: the op an
        # eager call under a dispatch mode runs, then the one torch.compile traces (registry's Op.forward_ops)
        self.forward_ops = tuple(getattr(ns, n).default for n in
                                 ([] if self.inout else [self.name]) + [f"{self.name}_fwd"])
        self.bwd_op = self._custom_op(f"{lib}::{self.name}_bwd", "bwd", self._bwd_sig()) \
            if spec.differentiable else None
        self.fn = self._autograd() if spec.differentiable else None
        if decl.flops:
            self._register_flops(ns)
        self._alloc_cache: dict = {}
        # compiled now (_plan's expressions: presence, layouts, output and scratch shapes): a call traced by
        # torch.compile only looks them up (dynamo cannot trace the builtin compile(); a process whose first use
        # of an op's entry was a compiled call failed on the output shapes, a CPU audit's find in session 72)
        shapes = [d for t in spec.outputs for sh in t.all_shapes() for d in sh] + [d for sc in decl.scratch
                                                                                  for d in sc.shape]
        for e in [*decl.present.values(), *spec.layouts.values(), *(d for d in shapes if isinstance(d, str))]:
            _fn(e)

    # ---- signatures: (name, annotation, mutated) in kernel order, params last
    def _t(self, t: TensorSpec, mutated: bool = False):
        return (t.name, "Optional[Tensor]" if t.optional else "Tensor", mutated)

    def _param_args(self):
        out = []
        for p in self.spec.params:
            ann = _PY[p.type]
            out.append((p.name, f"Optional[{ann}]" if p.nullable or p.default is None else ann, False))
        return out

    def _fwd_sig(self):
        ins = [self._t(t, t.role == "inout") for t in self.spec.inputs]
        outs = [self._t(t, True) for t in self.spec.outputs]
        scratch = [(s.name, "Tensor", True) for s in self.decl.scratch]
        return ins + outs + scratch + self._param_args()

    def _saved_spec(self, name: str):
        for t in self.spec.inputs + self.spec.outputs:
            if t.name == name:
                return t.optional
        return False

    def _bwd_sig(self):
        grads = [(f"grad_{n}", "Tensor", False) for n in self.diff_out]  # (dk would clash with a param)
        saved = [(n, "Optional[Tensor]" if self._saved_spec(n) else "Tensor", False) for n in self.decl.saves]
        dins = [(f"d_{t.name}", "Optional[Tensor]" if t.optional or not _always_grad(t) or t.name in
                 self.decl.skippable else "Tensor", True) for t in self.spec.inputs if t.name in self.diff_in]
        return grads + saved + dins + self._param_args()

    def _custom_op(self, qualname: str, pass_: str, sig) -> Callable:
        names = [n for n, _, _ in sig]
        args = ", ".join(f"{n}: {a}" for n, a, _ in sig)
        src = (f"def {self.name}_{pass_}({args}, backend: str) -> None:\n"
               f"    run_kernel(get_kernel({self.name!r}, backend, {pass_!r}), ({', '.join(names)},))\n")
        g = {"Tensor": Tensor, "Optional": Optional, "get_kernel": get_kernel, "run_kernel": run_kernel}
        exec(compile(src, f"<generated {qualname}>", "exec"), g)  # noqa: S102 - our own source
        return torch.library.custom_op(qualname, g[f"{self.name}_{pass_}"],
                                       mutates_args=tuple(n for n, _, m in sig if m))

    def _alloc_op(self, qualname: str) -> Callable:
        """The fwd pass as a functional custom op: inputs and params in, its present outputs and
        scratch out (allocated inside). What a dispatch mode sees of an eager call (see ``forward``):
        a mode that caches an op's results and hands them back instead of running it again
        (selective activation checkpointing's save policies) must find the results among the op's
        outputs; the destination-passing ``_fwd`` op returns None, and a replay of that left the
        recomputed outputs unwritten (NaN / garbage gradients, measured on the CPU). Its fake
        implementation allocates only."""
        sig = [self._t(t, t.role == "inout") for t in self.spec.inputs] + self._param_args()
        args = ", ".join(f"{n}: {a}" for n, a, _ in sig)
        ins, ps = ", ".join(self.ins), ", ".join(self.params)
        fns = {}
        for what, run in (("real", True), ("fake", False)):
            src = (f"def {self.name}({args}, backend: str) -> list[Tensor]:\n"
                   f"    return _GEN._alloc_and_run([{ins}], [{ps}], backend, {run})\n")
            g = {"Tensor": Tensor, "Optional": Optional, "_GEN": self}
            exec(compile(src, f"<generated {qualname} ({what})>", "exec"), g)  # noqa: S102 - our own source
            fns[what] = g[self.name]
        op = torch.library.custom_op(qualname, fns["real"], mutates_args=tuple(self.inout))
        op.register_fake(fns["fake"])
        return op

    def _alloc_and_run(self, tensors: list, params: list, backend: str, run: bool) -> list:
        made = self.allocate(tensors, params, tensors[0].device)
        if run:
            run_kernel(get_kernel(self.name, backend, "fwd"), (*tensors, *made, *params))
        return [m for m in made if m is not None]

    # ---- flop formulas (torch.utils.flop_counter)
    def _register_flops(self, ns) -> None:
        from torch.utils.flop_counter import register_flop_formula

        fwd_e, bwd_e = self.decl.flops
        n_in, n_p = len(self.ins), len(self.params)
        n_made = len(self.outs) + len(self.decl.scratch)
        fwd_names = self.ins + self.params + ["backend"]
        dest_names = [n for n, _, _ in self._fwd_sig()] + ["backend"]

        def functional(*args, out_val=None, **kw):
            a = _positional(args, kw, fwd_names)
            return self._count(fwd_e, dict(zip(self.ins, a[:n_in])), a[n_in:n_in + n_p])

        def destination(*args, out_val=None, **kw):
            a = _positional(args, kw, dest_names)
            return self._count(fwd_e, dict(zip(self.ins, a[:n_in])), a[n_in + n_made:n_in + n_made + n_p])

        if self.fwd_alloc_op is not None:
            register_flop_formula(getattr(ns, self.name), get_raw=True)(functional)
        register_flop_formula(getattr(ns, f"{self.name}_fwd"), get_raw=True)(destination)
        if self.bwd_op is None:
            return
        bwd_names = [n for n, _, _ in self._bwd_sig()] + ["backend"]
        n_g, n_s, n_d = len(self.diff_out), len(self.decl.saves), len(self.diff_in)

        def backward(*args, out_val=None, **kw):
            a = _positional(args, kw, bwd_names)
            saved = dict(zip(self.decl.saves, a[n_g:n_g + n_s]))
            dins = dict(zip(self.diff_in, a[n_g + n_s:n_g + n_s + n_d]))
            # an input's shape from the saved input, else from its gradient (same shape)
            tensors = {n: saved[n] if n in saved else dins.get(n) for n in self.ins}
            flags = {f"d_{n}": d is not None for n, d in dins.items()}
            return self._count(bwd_e, tensors, a[n_g + n_s + n_d:n_g + n_s + n_d + n_p], flags)

        register_flop_formula(getattr(ns, f"{self.name}_bwd"), get_raw=True)(backward)

    def _count(self, expr: str, tensors: dict, params, extra: dict = {}) -> int:  # noqa: B006 - read only
        params = dict(zip(self.params, params))
        env = self._dims(tensors, params, self._layout(tensors, params))
        n = evaluate(expr, {**env, **extra})
        return n if isinstance(n, torch.SymInt) else int(n)  # symbolic sizes stay symbolic (no guard)

    # ---- allocation
    def _dtype(self, t, tensors: dict, params: dict) -> torch.dtype:
        if t.name in self.decl.dtype_param:
            return getattr(torch, params[self.decl.dtype_param[t.name]])  # a spec DType name
        dts = t.dtypes
        if isinstance(dts, str):
            return tensors[dts[5:]].dtype
        if len(dts) > 1 and "float64" in dts and tensors[self.first_in].dtype == torch.float64:
            return torch.float64
        return getattr(torch, dts[0])

    def _layout(self, tensors: dict, params: dict) -> Optional[str]:
        if not self.spec.layouts:
            return None
        env = {"present": lambda t: t is not None, **tensors, **params}
        for name, cond in self.spec.layouts.items():
            if evaluate(cond, env):
                return name
        raise ValueError(f"{self.name}: no layout matches")  # the registry refuses this first

    def _dims(self, tensors: dict, params: dict, layout) -> dict:
        env = {k: v for k, v in params.items() if isinstance(v, (int, float, bool))}
        dimnames = {d.name for d in self.spec.dims}
        for t in self.spec.inputs:
            v = tensors[t.name]
            if v is None:
                continue
            for d, size in zip(t.shape_for(layout), v.shape):
                if isinstance(d, str) and d in dimnames and d not in env:
                    env[d] = size
        return env

    def _plan(self, tensors: dict, params: dict) -> list:
        """[(name, shape, dtype) or (name, None, None) for an absent output]: outputs then scratch."""
        layout = self._layout(tensors, params)
        env = self._dims(tensors, params, layout)
        plan = []
        for t in self.spec.outputs:
            cond = self.decl.present.get(t.name)
            if cond is not None and not evaluate(cond, params):
                plan.append((t.name, None, None))
                continue
            shape = tuple(d if isinstance(d, int) else evaluate(d, env) for d in t.shape_for(layout))
            plan.append((t.name, shape, self._dtype(t, tensors, params)))
        for s in self.decl.scratch:
            shape = tuple(d if isinstance(d, int) else evaluate(d, env) for d in s.shape)
            plan.append((s.name, shape, self._dtype(s, tensors, params)))
        return plan

    def plan(self, tensors: list, params: list) -> list:
        """:meth:`_plan`, cached by shapes, dtypes and params (not while torch.compile traces)."""
        if torch.compiler.is_compiling():
            return self._plan(dict(zip(self.ins, tensors)), dict(zip(self.params, params)))
        key = (tuple(None if v is None else (v.shape, v.dtype) for v in tensors), tuple(params))
        try:
            plan = self._alloc_cache.get(key)
        except TypeError:  # symbolic shapes (make_fx's symbolic tracing): no cache
            return self._plan(dict(zip(self.ins, tensors)), dict(zip(self.params, params)))
        if plan is None:
            if len(self._alloc_cache) > 256:
                self._alloc_cache.clear()
            plan = self._alloc_cache[key] = self._plan(dict(zip(self.ins, tensors)), dict(zip(self.params, params)))
        return plan

    def allocate(self, tensors: list, params: list, device) -> list:
        """Outputs + scratch for these inputs (None for an absent output)."""
        return [None if shape is None else empty(shape, dt, device) for _, shape, dt in self.plan(tensors, params)]

    # ---- passes
    def forward(self, tensors: list, params: list, backend: str) -> list:
        """Allocate and run the fwd pass; returns outputs + scratch (None for an absent output).
        An eager call under a dispatch mode (selective checkpointing, FakeTensorMode, make_fx,
        FlopCounterMode) or torch.func transform (functionalize) goes through the functional op, whose
        outputs the mode sees; torch.compile traces the destination-passing ``_fwd`` op (functionalized
        by AOTAutograd); a plain eager call runs the kernel directly (``_glue.run_pass``)."""
        traced = torch.compiler.is_compiling()
        moded = not traced and (torch._C._len_torch_dispatch_stack() or torch._C._are_functorch_transforms_active())
        if moded and self.fwd_alloc_op is not None:
            got = iter(self.fwd_alloc_op(*tensors, *params, backend))
            return [None if shape is None else next(got) for _, shape, _ in self.plan(tensors, params)]
        made = self.allocate(tensors, params, tensors[0].device)
        run_pass(self.fwd_op, self.name, "fwd", *tensors, *made, *params, backend=backend, via_op=traced or moded)
        if not (traced or moded):  # the kernel wrote the inout inputs through raw pointers, past autograd's version
            for i in self._inout_at:  # counter: bump it, so a value saved for a backward is seen as changed
                torch.autograd.graph.increment_version(tensors[i])  # (~0.3 us each)
        return made

    def _autograd(self):
        gen = self
        n_in, n_out = len(self.ins), len(self.outs)
        # Positions fixed at definition, so a call does index lookups only (no name maps per call).
        every = self.ins + self.outs + [s.name for s in self.decl.scratch]
        save_at = tuple(every.index(n) for n in self.decl.saves)            # in (*inputs, *outputs, *scratch)
        diff_in_at = tuple(self.ins.index(n) for n in self.diff_in)
        diff_out_at = tuple(self.outs.index(n) for n in self.diff_out)
        nondiff_at = tuple(i for i, t in enumerate(self.spec.outputs) if not t.differentiable)
        grad_slot = tuple(self.diff_in.index(n) if n in self.diff_in else None for n in self.ins)
        no_grads = (None,) * (len(self.params) + 1)                        # the params' and backend's
        # (slot among the gradients, position among the inputs, name) of each input a kernel may skip
        skippable = tuple((k, i, n) for k, (i, n) in enumerate(zip(diff_in_at, self.diff_in))
                          if n in self.decl.skippable)

        def grad_meta(tensors) -> list:
            """(shape, dtype, device) of each differentiable input's gradient; None for an absent input or
            one whose dtype cannot carry a gradient (float8 data)."""
            return [None if t is None or t.dtype not in GRAD_DTYPES else (t.shape, t.dtype, t.device)
                    for t in (tensors[i] for i in diff_in_at)]

        def saved_and_returned(ctx, tensors, made, present):
            """A forward's end (Fn's and FnP's): what the backward needs saved on ctx, the non-differentiable
            outputs marked, the present outputs (their positions ``present``) returned."""
            both = (*tensors, *made)
            ctx.save_for_backward(*[both[i] for i in save_at])
            if nondiff_at:
                nondiff = [made[i] for i in nondiff_at if made[i] is not None]
                if nondiff:
                    ctx.mark_non_differentiable(*nondiff)
            return _returned(made, present)

        def grad_buffers(ctx, grads, at, meta, backend: str):
            """(the grad outputs the bwd kernel reads, contiguous; the input gradients it writes, allocated: None
            for an absent input or a skipped one). ``at``: each differentiable output's grad's position in
            ``grads`` (:func:`grad_positions`); ``meta``: ``grad_meta``'s of the call."""
            gout = [grads[i].contiguous() for i in at]
            if skippable:
                frozen = [(k, n) for k, i, n in skippable if not ctx.needs_input_grad[i]]
                if frozen:  # a gradient autograd does not need: None where the backend's kernel skips it
                    skips, meta = skipped_grads(gen.name, backend), list(meta)
                    for k, n in frozen:
                        if n in skips:
                            meta[k] = None
            return gout, [None if m is None else empty(*m) for m in meta]

        def grad_positions(returned) -> tuple:
            """Each differentiable output's grad's position among a backward's grads (``returned``: the returned
            outputs' positions, None when all are: grads in output order)."""
            return diff_out_at if returned is None else tuple(returned.index(i) for i in diff_out_at)

        def bwd(ctx, *grads, via_op: Optional[bool] = None, saved: Optional[tuple] = None):
            saved = ctx.saved_tensors if saved is None else saved  # (unpacked once: checkpointing allows no more)
            gout, dins = grad_buffers(ctx, grads, grad_positions(ctx.returned), ctx.in_meta, ctx.backend)
            # via_op: through the dispatcher, which unwraps a transform's wrappers (dead ones too); None: asked
            run_pass(gen.bwd_op, gen.name, "bwd", *gout, *saved, *dins, *ctx.params, backend=ctx.backend,
                     via_op=via_op)
            return (*[None if k is None else dins[k] for k in grad_slot], *no_grads)

        def bwd_recording(ctx, grads, via_op: Optional[bool] = None):
            """The pass in a backward that records (create_graph, or a torch.func transform): run without
            recording (the custom op's autograd would wrap it), its results behind ``_NoSecondOrder``. The
            saved tensors are unpacked once (non-reentrant checkpointing refuses a second unpack; offload
            hooks would copy them back twice)."""
            saved = ctx.saved_tensors
            with torch.no_grad():
                res = bwd(ctx, *grads, via_op=via_op, saved=saved)
            return _no_second_order(gen.name, res, (*grads, *saved))

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                tensors, params, backend = args[:n_in], args[n_in:-1], args[-1]
                made = gen.forward(tensors, params, backend)
                present = [i for i in range(n_out) if made[i] is not None]
                ctx.params, ctx.backend, ctx.in_meta = params, backend, grad_meta(tensors)
                ctx.returned = None if len(present) == n_out else present
                return saved_and_returned(ctx, tensors, made, present)

            @staticmethod
            def backward(ctx, *grads):
                # a torch.func transform over a plain graph's backward (autograd.grad inside func.grad, a
                # functorch vmap over it): refused where it would differentiate the backward (create_graph
                # and grads it tracks) or batch it; then through the custom op, which unwraps its wrappers
                recording = torch.is_grad_enabled()
                if torch._C._are_functorch_transforms_active():
                    func_transforms(gen.name, differentiable=recording, backward_of=PLAIN_AUTOGRAD,
                                    grads=grads if recording else ())
                    return bwd_recording(ctx, grads, via_op=True)
                if _fwad._current_level >= 0:  # a dual grad output: its tangent would be lost in the kernel
                    _no_duals(gen.name, grads)
                # once-differentiable: the engine runs a backward with grad mode off unless create_graph;
                # off, nothing to guard (host cost: benchmarks/results/registry.md)
                return bwd_recording(ctx, grads) if recording else bwd(ctx, *grads)

        class FnT(torch.autograd.Function):
            """The same passes in the form torch.func's grad and vjp take (see ``_Gen.call_transformed``):
            a forward without ctx that returns the outputs and the scratch (None where absent), and a
            setup_context that saves from them (a transform wraps each saved tensor for its level, so every
            one must be among the Function's inputs or outputs). The last input is the grad transform the
            call ran under (``GradLevel``), for the backward's check. Only used under a transform: the
            extra outputs would cost an eager step host time."""

            @staticmethod
            def forward(*args):
                tensors, params, backend = args[:n_in], args[n_in:-2], args[-2]
                return tuple(gen.forward(tensors, params, backend))

            @staticmethod
            def setup_context(ctx, inputs, output):
                tensors, params = inputs[:n_in], inputs[n_in:-2]
                both = (*tensors, *output)
                ctx.save_for_backward(*[both[i] for i in save_at])
                ctx.params, ctx.backend, ctx.level, ctx.returned = params, inputs[-2], inputs[-1], None
                ctx.in_meta = grad_meta(tensors)
                fixed = [o for i, o in enumerate(output) if o is not None and (i >= n_out or i in nondiff_at)]
                if fixed:
                    ctx.mark_non_differentiable(*fixed)

            @staticmethod
            def backward(ctx, *grads):
                # another transform that would differentiate this backward is refused first; the pass goes
                # through its custom op: the saved tensors stay wrapped for the transform's level (dead
                # wrappers once it has returned: a vjp function called afterwards), with no data pointer a
                # GPU kernel could take
                func_transforms(gen.name, backward_of=ctx.level, grads=grads)
                return (*bwd_recording(ctx, grads, via_op=True), None)

        class FnP(torch.autograd.Function):
            """Fn for a prepared call (``_Gen.prepared``): the inputs, then the :class:`Prepared` that holds what
            every call of that metadata shares (allocation plan, params, backend, gradient metadata, kernel keys),
            so a call passes no params and recomputes none of it; ctx keeps the Prepared. The backward is Fn's:
            its plain case (no graph recorded, no transform, mode or trace) here, with the Prepared's bwd kernel
            called directly; any other case through Fn.backward itself."""

            @staticmethod
            def forward(ctx, *args):
                prep = args[-1]
                tensors = args[:-1]
                made = prep.alloc()
                prep.run_fwd(tensors, made)
                ctx.prep = prep
                return saved_and_returned(ctx, tensors, made, prep.present)

            @staticmethod
            def backward(ctx, *grads):
                prep = ctx.prep
                if torch.is_grad_enabled() or _moded() or torch.compiler.is_compiling():  # (compiled autograd
                    # traces it): Fn's backward, with Fn's ctx
                    ctx.params, ctx.backend, ctx.in_meta, ctx.returned = prep.params, prep.backend, \
                        prep.in_meta, prep.returned
                    return Fn.backward(ctx, *grads)[:n_in + 1]  # the inputs' gradients, the Prepared's None
                # Fn.backward's plain case (bwd with via_op=False: run_pass's direct call) on the Prepared's fields
                gout, dins = grad_buffers(ctx, grads, prep.grad_at, prep.in_meta, prep.backend)
                run_kernel(get_kernel(*prep.bkey), (*gout, *ctx.saved_tensors, *dins, *prep.params))
                return (*[None if k is None else dins[k] for k in grad_slot], None)

        Fn.__name__ = Fn.__qualname__ = "".join(w.title() for w in self.name.split("_"))
        FnT.__name__ = FnT.__qualname__ = Fn.__name__ + "Func"
        FnP.__name__ = FnP.__qualname__ = Fn.__name__ + "Prepared"
        for cls in (Fn, FnT, FnP):  # the graph nodes' names (grad_fn, anomaly mode, profiler): the op's, not "Fn"'s
            bw = getattr(cls, "_backward_cls", None)
            if bw is not None:
                bw.__name__ = bw.__qualname__ = cls.__name__ + "Backward"
        self.fn_func, self.fn_prepared, self.grad_meta, self.grad_positions = FnT, FnP, grad_meta, grad_positions
        return Fn

    def call(self, tensors, params, backend: str):
        if torch._C._are_functorch_transforms_active():
            if self.fn is None:  # (the registry refused already; a direct entry call refuses here)
                if not torch.compiler.is_compiling():
                    func_transforms(self.name, differentiable=False, in_place=tuple(self.inout))
            elif torch.compiler.is_compiling():  # (dynamo traces the check: it raises while tracing)
                raise NotImplementedError(
                    f"{self.name}: torch.compile around a torch.func transform of the op is not supported; "
                    "run the transform eagerly, or use torch.autograd under torch.compile")
            else:
                return self.call_transformed(tensors, params, backend)
        if self.fn is not None and _needs_autograd(tensors):
            if _fwad._current_level >= 0:
                _no_duals(self.name, tensors)
            if torch.compiler.is_compiling():
                tensors = _distinct(tensors)
                if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
                    _warn_if_exporting(self.name)
            return self.fn.apply(*tensors, *params, backend)
        if self.fn is None and torch.is_grad_enabled():  # a non-differentiable op records no graph, whatever its inputs
            with torch.no_grad():
                made = self.forward(tensors, params, backend)
        else:  # no graph to record: autograd.Function.apply would only add its host cost (registry.md)
            made = self.forward(tensors, params, backend)
        outs = [o for o in made[:len(self.outs)] if o is not None]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def prepared(self, backend: str, params: dict, tensors) -> "Prepared | bool":
        """A :class:`Prepared` call for calls of this metadata (what the registry's guard pattern fixes: every
        input's size, strides, dtype, device and requires_grad, the params, the backend and grad mode), or False
        where the op has none (an op that updates an input in place keeps the general path). Built under the
        call that made the pattern; the registry keeps it with the pattern."""
        if self.inout or torch.compiler.is_compiling() or set(params) != set(self.params):
            return False
        return Prepared(self, backend, [params[n] for n in self.params], tensors)

    def call_transformed(self, tensors, params, backend: str):
        """A differentiable op's call under torch.func transforms: grad / vjp (one level) go through the
        setup_context Function; functionalize alone runs the fwd pass (through the functional op). vmap,
        jvp and a grad of the backward raise (``registry.transforms``)."""
        level = func_transforms(self.name)
        if level is not None:
            made = self.fn_func.apply(*tensors, *params, backend, GradLevel(level))
        else:
            if records_graph(tensors):
                raise NotImplementedError(
                    f"{self.name}: torch.func.functionalize of a call that records an autograd graph is not "
                    "supported (torch has no functionalize rule for an autograd.Function); use torch.compile, "
                    "or call it under torch.no_grad()")
            with torch.no_grad():
                made = self.forward(tensors, params, backend)
        outs = [o for o in made[:len(self.outs)] if o is not None]
        return outs[0] if len(outs) == 1 else tuple(outs)


class Prepared:
    """One op's eager call with its metadata fixed (``_Gen.prepared``; the registry's guard pattern holds one):
    the allocation plan, the params in kernel order, the gradients' metadata and which outputs are returned,
    worked out once. A call checks only what the pattern does not fix (a dispatch mode, a torch.func transform,
    forward-mode AD: those take ``_Gen.call``), then allocates, runs the fwd kernel (looked up per call: a
    replaced kernel is seen) and, where autograd records, does so through the op's ``FnP`` Function. Same
    results as ``_Gen.call``: the same allocation (``_glue.empty``'s poisoning included), kernel arguments,
    autocast handling, saved tensors and backward. Host cost: the registry ledger, sessions 63-64."""

    __slots__ = ("gen", "backend", "params", "shapes", "device", "in_meta", "returned", "present", "fkey", "bkey",
                 "grad_at", "autograd", "no_grad")

    def __init__(self, gen: _Gen, backend: str, params: list, tensors) -> None:
        self.gen, self.backend, self.params = gen, backend, tuple(params)
        plan = gen._plan(dict(zip(gen.ins, tensors)), dict(zip(gen.params, params)))
        self.shapes = tuple((shape, dt) for _, shape, dt in plan)
        self.device = tensors[0].device
        n_out = len(gen.outs)
        self.present = tuple(i for i in range(n_out) if plan[i][1] is not None)
        self.returned = None if len(self.present) == n_out else self.present
        self.fkey, self.bkey = (gen.name, backend, "fwd"), (gen.name, backend, "bwd")  # (run_pass's kernel lookups)
        # what the pattern fixes only (grad mode, requires_grad): not a forward-AD level or trace of the building call
        self.autograd = gen.fn is not None and torch.is_grad_enabled() and \
            any(t is not None and t.requires_grad for t in tensors)
        self.in_meta = gen.grad_meta(tensors) if self.autograd else None
        self.grad_at = gen.grad_positions(self.returned) if self.autograd else None
        # a non-differentiable op records no graph whatever its inputs (a torch backend's copy_ into an output
        # would): its pass runs with grad mode off, as in _Gen.call
        self.no_grad = gen.fn is None and torch.is_grad_enabled()

    def alloc(self) -> list:
        dev = self.device
        return [None if s is None else empty(s, dt, dev) for s, dt in self.shapes]

    def run_fwd(self, tensors, made: list) -> None:
        """The fwd kernel (looked up per call: a replaced kernel is seen), run directly (run_pass's via_op=False
        path): the call's checks are done."""
        run_kernel(get_kernel(*self.fkey), (*tensors, *made, *self.params))

    def __call__(self, tensors):
        if _moded():
            return self.gen.call(list(tensors), list(self.params), self.backend)
        if self.autograd:
            return self.gen.fn_prepared.apply(*tensors, self)
        made = self.alloc()
        if self.no_grad:
            with torch.no_grad():
                self.run_fwd(tensors, made)
        else:
            self.run_fwd(tensors, made)
        return _returned(made, self.present)


def _returned(made: list, present) -> "Tensor | tuple":
    """What an op's call returns: its present outputs (``present``: their positions in ``made``), one alone."""
    return made[present[0]] if len(present) == 1 else tuple(made[i] for i in present)


def _moded() -> bool:
    """Whether a dispatch mode, a forward-AD level or a torch.func transform is active: what a Prepared call (and
    its backward) leaves to the general path, which handles each."""
    return bool(torch._C._len_torch_dispatch_stack()) or _fwad._current_level >= 0 or \
        torch._C._are_functorch_transforms_active()


class _NoSecondOrder(torch.autograd.Function):
    """Identity on an op's input gradients, with the backward's inputs that autograd tracks (grad outputs,
    saved tensors) as inputs too: a gradient of the backward (second order, at any level) reaches this
    node and raises, naming the op. once_differentiable's error node hangs on detached copies instead,
    so a gradient with respect to chosen inputs (``autograd.grad(..., inputs)``, every torch.func
    transform) never reached it and got zeros (found by review, session 49)."""

    @staticmethod
    def forward(op, n, *ts):
        return tuple(t.detach() for t in ts[:n])

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.op = inputs[0]

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(f"{ctx.op}: a gradient through the op's backward (second order) is not "
                                  "supported: the backward is once-differentiable")

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(f"{ctx.op}: forward-mode AD through the op's backward is not supported")


def _no_duals(op: str, tensors) -> None:
    """Refuses a dual tensor (forward-mode AD) among ``tensors``: a kernel reads only its primal."""
    if any(t is not None and _fwad.unpack_dual(t).tangent is not None for t in tensors):
        raise NotImplementedError(f"{op}: forward-mode AD (a dual tensor: torch.autograd.forward_ad, "
                                  "torch.func.linearize) is not supported: the op has no jvp formula")


def _no_second_order(op: str, res: tuple, inputs: tuple) -> tuple:
    """``res`` (a backward's results) behind :class:`_NoSecondOrder` where one of ``inputs`` requires grad, at its
    own level or under a torch.func transform's wrappers (a tensor a ``func.grad`` closes over that the outer
    autograd tracks: a penalty on the transform's gradient differentiates the backward with respect to it)."""
    tracked = [t for t in inputs if isinstance(t, Tensor) and (t.requires_grad or host_tensor(t).requires_grad)]
    if not tracked:
        return res
    dins = [r for r in res if r is not None]
    got = _NoSecondOrder.apply(op, len(dins), *dins, *tracked)
    got = iter(got if isinstance(got, tuple) else (got,))
    return tuple(None if r is None else next(got) for r in res)


def _distinct(tensors) -> list:
    """While traced: a tensor passed as two inputs (``mhc_proj_rms(x, x)``) goes in once as itself and then as
    clones (whose gradients flow back to it), since dynamo refuses an autograd.Function given one tensor twice;
    eager passes it as is (same results)."""
    out = []
    for t in tensors:  # (`is`, not id(): dynamo guards on an id it traces, and would recompile for every tensor)
        if isinstance(t, Tensor) and any(t is u for u in out):
            t = t.clone()
        out.append(t)
    return out


def _positional(args: tuple, kwargs: dict, names: list) -> list:
    """A custom op's arguments in signature order, however they were passed."""
    return list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]


def _always_grad(t: TensorSpec) -> bool:
    """Whether a differentiable input always gets a gradient tensor: every dtype it admits can
    carry one (a list; "like:" names a tensor the op's gradients flow through). Otherwise the
    bwd pass's d_<name> is optional: None for a call whose tensor is, say, float8 data."""
    return isinstance(t.dtypes, str) or set(t.dtypes) <= GRAD_DTYPE_NAMES


_EXPORT_WARNED: set = set()


@torch.compiler.assume_constant_result
def _warn_if_exporting(op: str) -> bool:
    """Under torch.export, warns (once an op) that it keeps the op's forward only: export traces its
    autograd.Function's forward (the destination-passing ``<op>_fwd``, which has no autograd), so running the
    exported program gives the op's outputs no gradient, silently (a CPU audit, session 72). Inference exports are
    unaffected; a training export of the op (QAT, fine-tuning from an ExportedProgram) is not supported: use
    torch.compile there. Runs outside the trace (assume_constant_result), so it reads the real export flag: dynamo
    before torch 2.13 folds a traced ``torch.compiler.is_exporting()`` to True under any torch.compile (torch
    2.11 on the GPU host: this warning under plain torch.compile, session 72)."""
    if torch.compiler.is_exporting() and op not in _EXPORT_WARNED:
        _EXPORT_WARNED.add(op)
        import warnings

        warnings.warn(f"{op}: torch.export keeps this op's forward only: in the exported program its outputs "
                      "carry no gradient (fine for inference; for training use torch.compile)", stacklevel=2)
    return True


def _needs_autograd(tensors) -> bool:
    """Whether a differentiable op's call goes through its autograd.Function: grad mode on and an input
    that requires grad (autograd's own rule for a Function's outputs), or a tracer that must see the
    Function (torch.compile, forward-mode AD, which raises there: no jvp; torch.func transforms are
    ``_Gen.call``'s, before this). Otherwise the call records nothing and runs the fwd pass directly,
    with the same outputs."""
    if torch.compiler.is_compiling() or _fwad._current_level >= 0:
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def define(spec: OpSpec, decl: Decl = Decl(), doc: str = "") -> Callable:
    """The functional entry of ``spec``: ``entry(*inputs, <params>, backend="torch")``.

    Builds the custom ops, allocation and autograd (see the module doc). The entry
    trusts its inputs: call it through ``registry.get(spec.name)`` to validate.
    """
    gen = _Gen(spec, decl)
    req = [t.name for t in spec.inputs if not t.optional]
    opt = [t.name for t in spec.inputs if t.optional]
    pnames = [p.name for p in spec.params]
    sig = ", ".join(req + [f"{n}=None" for n in opt])
    kw = ", ".join([f"{p.name}=_D[{p.name!r}]" for p in spec.params] + ["backend='torch'"])
    src = (f"def {spec.name}({sig}{', ' if sig else ''}*, {kw}):\n"
           f"    return _GEN.call([{', '.join(t.name for t in spec.inputs)}], [{', '.join(pnames)}], backend)\n")
    g = {"_GEN": gen, "_D": {p.name: p.default for p in spec.params}}
    exec(compile(src, f"<generated entry {spec.name}>", "exec"), g)  # noqa: S102 - our own source
    fn = g[spec.name]
    fn.__doc__ = doc or _doc(spec)
    # where the spec says the entry lives ("tilekernels.mhc.ops:h_aggregate"), so pickle (torch.save of a
    # module holding it, multiprocessing spawn) finds it by reference there, not in an exec namespace
    fn.__module__, _, fn.__qualname__ = spec.entry.partition(":")
    fn.gen = gen
    return fn


def _doc(spec: OpSpec) -> str:
    def shape(t):
        s = t.shape if isinstance(t.shape, list) else " | ".join(f"{k}: {v}" for k, v in t.shape.items())
        return f"{t.name} {s} {t.dtypes}" + (" (optional)" if t.optional else "") + (f": {t.doc}" if t.doc else "")
    lines = [spec.doc, "", "Inputs:"] + [f"  {shape(t)}" for t in spec.inputs]
    lines += ["Outputs:"] + [f"  {shape(t)}" for t in spec.outputs]
    if spec.params:
        lines += ["Params:"] + [f"  {p.name}={p.default!r} ({p.type}){': ' + p.doc if p.doc else ''}"
                                for p in spec.params]
    lines += ["", f"Call through registry.get({spec.name!r}) to validate inputs and pick the backend; "
                  "this function trusts its inputs."]
    return "\n".join(lines)
