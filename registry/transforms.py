"""Which torch.func transforms a registry op takes, checked before validation reads anything.

* ``torch.func.grad`` / ``vjp`` (one level): yes. The generated ops run a setup_context form of
  their autograd.Function there (``tilekernels/_opgen.py``); the kernels see plain tensors (the
  passes go through their custom ops, whose dispatch unwraps the transform's wrappers).
* ``torch.func.functionalize`` alone: yes, through an op's functional custom op; not for an op
  that updates an input in place (gdn_decode), nor with a grad transform or a recorded graph
  (torch has no functionalize rule for an autograd.Function).
* vmap (and jacrev, jacfwd, hessian, per-sample gradients, which vmap) and jvp: refused with a
  NotImplementedError naming the op. The kernels have no batching rule and no forward-mode
  formula; without the refusal a vmap would fail deep in a kernel's launch, or a value rule's
  host read, with torch's message about a batched tensor.
* A grad transform that would differentiate an op's backward (nested grad, or a grad of a vjp
  function with respect to its cotangents): refused. The backward's kernels are
  once-differentiable; their results carry no derivative, so such a transform would get zeros.
  (A gradient that reaches a recorded backward by other routes, e.g. ``autograd.grad`` with
  create_graph inside a transform, raises in ``tilekernels._opgen._NoSecondOrder``.)
"""
from __future__ import annotations

from typing import Optional

import torch


class GradLevel:
    """The grad transform a call ran under: its level and a tensor wrapped at it, which becomes a
    dead wrapper when that transform returns (the next transform reuses the level's number, so the
    number alone cannot tell a later transform from the one that recorded the call)."""

    __slots__ = ("level", "probe")

    def __init__(self, level: Optional[int]):
        from torch._C._functorch import _wrap_for_grad, maybe_get_level

        self.level, self.probe = level, None
        if level is not None:
            probe = torch.empty(())  # made under the transform: already wrapped at its level
            self.probe = probe if maybe_get_level(probe) == level else _wrap_for_grad(probe, level)

    def recorded_by(self, level: int) -> bool:
        from torch._C._functorch import is_dead_tensor_wrapper

        return self.probe is not None and level == self.level and not is_dead_tensor_wrapper(self.probe)


PLAIN_AUTOGRAD = GradLevel(None)  # a call plain autograd recorded: no transform's level is its own


def func_transforms(op: str, differentiable: bool = True, backward_of: Optional[GradLevel] = None,
                    grads: tuple = (), in_place: tuple = ()) -> Optional[int]:
    """The level of the one active grad transform (torch.func.grad / vjp), None for none; raises a
    NotImplementedError naming ``op`` for a transform it cannot take (the module doc). In a backward,
    ``backward_of`` is the transform its forward ran under and ``grads`` the incoming gradients: another
    grad transform that tracks them (wrapped at its level and requiring grad there, unlike the zeros
    autograd makes for an unused output) is differentiating the backward. ``in_place``: the inputs the op
    updates in place (functionalize refused). A non-``differentiable`` op records nothing for a grad
    transform, so nested grad levels and functionalize beside them are fine for it."""
    from torch._C._functorch import TransformType, maybe_get_level
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

    stack = [(i.key(), i.level()) for i in retrieve_all_functorch_interpreters()]
    kinds = [k for k, _ in stack]
    if TransformType.Vmap in kinds:
        raise NotImplementedError(
            f"{op}: torch.func.vmap (also jacrev, jacfwd, hessian, which vmap) is not supported: its kernels "
            "have no batching rule; fold the batch into the op's own token or batch dim, or loop")
    if TransformType.Jvp in kinds:
        raise NotImplementedError(f"{op}: forward-mode AD (torch.func.jvp, jacfwd) is not supported: "
                                  "the op has no jvp formula")
    levels = [lvl for k, lvl in stack if k == TransformType.Grad]
    if differentiable and len(levels) > 1 or backward_of is not None and levels \
            and not backward_of.recorded_by(levels[0]) \
            and any(g is not None and maybe_get_level(g) == levels[0] and g.requires_grad for g in grads):
        raise NotImplementedError(f"{op}: higher-order gradients (torch.func.grad / vjp through the op's "
                                  "backward) are not supported: the backward is once-differentiable")
    if TransformType.Functionalize in kinds:
        if levels and differentiable:
            raise NotImplementedError(f"{op}: torch.func.grad / vjp together with functionalize is not supported "
                                      "(torch has no functionalize rule for an autograd.Function); use torch.compile")
        if in_place:
            raise NotImplementedError(f"{op}: torch.func.functionalize is not supported: the op updates "
                                      f"{', '.join(in_place)} in place; use torch.compile")
    return levels[0] if levels else None


def host_tensor(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor under torch.func's wrappers (functionalize's, a grad level's), for a host read
    of its values (a wrapper has no storage of its own); ``t`` itself otherwise."""
    from torch._C._functorch import get_unwrapped, is_functorch_wrapped_tensor

    while True:
        if torch._is_functional_tensor(t):
            torch._sync(t)
            t = torch._from_functional_tensor(t)
        elif is_functorch_wrapped_tensor(t):
            t = get_unwrapped(t)
        else:
            return t


def records_graph(tensors) -> bool:
    """Whether autograd records a call on ``tensors`` under functionalize: grad mode on and an input, or
    the tensor under its functionalize wrapper (which reports requires_grad False), that requires grad."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        while t is not None and torch._is_functional_tensor(t) and not t.requires_grad:
            t = torch._from_functional_tensor(t)
        if t is not None and t.requires_grad:
            return True
    return False
