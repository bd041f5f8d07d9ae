"""What a family declares so ``tk-bench`` can run and count its ops.

Each family's ``bench.py`` exposes ``cases(device_type) -> list[BenchCase]``:
small shapes on "cpu", the OPS.md headline shapes on "cuda". Bytes and flops
are counted by hand: every input read once, every output written once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

Dims = dict[str, int]
# make(dims, device) -> (positional tensors in spec order, params)
Maker = Callable[[Dims, torch.device], tuple[tuple, dict[str, Any]]]
Counter = Callable[[Dims], int]


@dataclass(frozen=True)
class Peer:
    """An outside implementation of the case's op (the issue's named peer: torch's bf16 grouped
    GEMM, an fp8 GEMM, FLA, ...) that tk-bench times beside ours in the same harness.

    ``prepare(args, params)`` gets the case's inputs (for fwd+bwd: the same leaf tensors the op
    gets, which require grad) and returns a call whose result lines up with the op's results
    (same order; for fwd+bwd the differentiable ones are backpropagated with the op's pre-made
    grad outputs, leaves' grads set to None each step, exactly as the op's step). Work a peer
    does once (quantizing operands, building offsets) happens in ``prepare``, outside the timed
    region; ``note`` says what the peer leaves out or adds, so the ratio is read correctly.
    ``backward=False``: timed in the fwd pass only. A peer whose import or call fails is n/a."""
    name: str
    prepare: Callable[[tuple, dict[str, Any]], Callable[[], Any]]
    backward: bool = True
    devices: tuple[str, ...] = ("cuda",)
    note: str = ""


@dataclass(frozen=True)
class BenchCase:
    op: str
    dims: Dims
    make: Maker
    bytes_fwd: Counter
    bytes_bwd: Optional[Counter] = None
    flops_fwd: Optional[Counter] = None
    flops_bwd: Optional[Counter] = None
    variant: str = ""
    dtype: str = "bfloat16"
    # names of inputs that get gradients in the fwd+bwd measurement
    grad_inputs: tuple[str, ...] = field(default_factory=tuple)
    # The float64 oracle when the op's reference on float64 upcasts is not the op's own
    # definition (None: ``op.reference``): ``oracle(results, *inputs, **params)``, with the
    # op's own (detached) results first, then the reference's arguments; differentiable in the
    # inputs. E.g. an op that rounds an intermediate to the activation dtype by definition
    # (mhc_post_pre feeds its bf16 ``out`` to the pre step) takes that rounded value from the op
    # (a float64 rounding can land one ulp off the kernel's fp32 one), so its fp32 results stay
    # under the fp32 tolerance. The oracle's docstring says why.
    oracle: Optional[Callable[..., Any]] = None
    # the op only moves elements (a permutation, a collective): every output and gradient must
    # equal the reference's bit for bit, not to its dtype's tolerance
    exact: bool = False
    # named outside implementations timed beside the op (``Peer``), on the devices they list
    peers: tuple[Peer, ...] = ()
