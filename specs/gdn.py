"""Gated DeltaNet (GDN) op specs. See ../shared/OPS.md, section "Gated DeltaNet".

Projection layout (Megatron's, section-contiguous): ``mixed[..., D]`` with
``D = 2*Hk*dk + 2*Hv*dv + 2*Hv``, sections ``q | k | v | z | b | a``; the conv
covers ``q | k | v`` (``conv_dim = 2*Hk*dk + Hv*dv``).

Which sizes come from where: ``Hv`` is bound from ``A_log [Hv]`` and ``W`` from
``conv_weight [conv_dim, W]``. ``Hk`` (and in ``gdn_pre_gated`` also ``dk``)
cannot be recovered from the tensor shapes alone (only the product ``Hk*dk`` is),
so they are int params with Qwen3-Next defaults (Hk=16, dk=dv=128). ``dv`` could
be (``(D - conv_dim - 2*Hv) / Hv`` once ``Hk*dk`` is known), but it is an int
param of ``gdn_pre_gated`` too, as in the peers' signatures, so a layout mistake
is caught rather than absorbed into dv; ``mixed``'s last dim and ``conv_weight``'s
first dim are shape expressions in them, so a wrong head count is refused as a
shape error naming the sizes it used. In ``gdn_decode``, ``dk`` and ``dv`` are dims
bound from ``ssm_state``.
"""
from __future__ import annotations

from .schema import Backend, Constraint, Dim, OpSpec, Param, TensorSpec, eps_param

D_EXPR = "2*Hk*dk + 2*Hv*dv + 2*Hv"
CONV_DIM_EXPR = "2*Hk*dk + Hv*dv"
HQ_EXPR = "Hv if repeat_qk else Hk"

_FLOAT = ["bfloat16", "float32", "float64"]
_GATE_PARAM = ["float32", "float64"]

_Hv = Dim(name="Hv", min=1, doc="value heads (bound from A_log)")
_W = Dim(name="W", min=1, doc="conv width (4 in Qwen3-Next)")
_TORCH_FWD_BWD = Backend(name="torch", module="tilekernels.gdn.ops")
_TORCH_FWD = Backend(name="torch", module="tilekernels.gdn.ops", passes=["fwd"])

_HK = Param(name="Hk", type="int", default=16, min=1, doc="key heads (q and k)")
_EPS = eps_param("eps", "l2norm epsilon: x * rsqrt(sum(x^2) + eps) (as 0, an all-zero q / k head would give 0 / 0, "
                        "written into the decode state)")


def _weights(conv_rows: str) -> list[TensorSpec]:
    return [
        TensorSpec(name="conv_weight", shape=[conv_rows, "W"], dtypes=_FLOAT,
                   doc="[conv_dim, W] depthwise causal conv kernel (no bias); tap W-1 is the current token"),
        TensorSpec(name="A_log", shape=["Hv"], dtypes=_GATE_PARAM,
                   doc="[Hv] fp32: g = -exp(A_log) * softplus(a + dt_bias)"),
        TensorSpec(name="dt_bias", shape=["Hv"], dtypes=_GATE_PARAM, doc="[Hv] fp32"),
    ]


_F64_ALL = Constraint(
    expr="dtype(mixed) != 'float64' or (dtype(conv_weight) == 'float64' and dtype(A_log) == 'float64' "
         "and dtype(dt_bias) == 'float64')",
    message="float64 mixed (reference/gradcheck mode) needs float64 conv_weight, A_log and dt_bias")
_HV_HK = Constraint(expr="Hv % Hk == 0", message="every key head serves Hv/Hk value heads")

_BSHD = "bshd"
_THD = "thd"


def _seq(bshd: list, thd: list) -> dict:
    return {_BSHD: bshd, _THD: thd}


# the GPU backends' dtypes (both read A_log and dt_bias in fp32)
_PRE_GATED_DTYPES = {"mixed": ["bfloat16", "float32"], "conv_weight": ["bfloat16", "float32"],
                     "A_log": ["float32"], "dt_bias": ["float32"]}

PRE_GATED = OpSpec(
    name="gdn_pre_gated",
    family="gdn",
    doc=("Everything between the in-projection and the chunked delta rule: y = silu(causal depthwise "
         "conv1d over T of mixed[q|k|v], zero history, never across a THD sequence boundary); "
         "q, k = l2norm over dk of their slices of y (optionally repeat_interleave'd by Hv/Hk to Hv heads); "
         "v = its slice of y; z = its slice of mixed (no conv); beta = sigmoid(b); "
         "g = -exp(A_log) * softplus(a + dt_bias) in fp32. With return_conv_state, also the final conv "
         "state [N, conv_dim, W-1]: the last W-1 conv inputs of each sequence, oldest first, zero-padded "
         "on the old side (N = B for BSHD); it is not differentiable. "
         "bwd: dmixed, dconv_weight, dA_log, ddt_bias."),
    dims=[
        Dim(name="B", doc="batch (BSHD only)"),
        Dim(name="T", doc="tokens per sequence (BSHD) or packed tokens T_total (THD)"),
        Dim(name="S", min=1, doc="len(cu_seqlens) = N + 1 (THD only)"),
        _Hv, _W,
    ],
    inputs=[
        TensorSpec(name="mixed", shape=_seq(["B", "T", D_EXPR], ["T", D_EXPR]), dtypes=_FLOAT,
                   doc="[B, T, D] (BSHD) or [T_total, D] (THD), contiguous; sections q|k|v|z|b|a"),
        *_weights(CONV_DIM_EXPR),
        TensorSpec(name="cu_seqlens", shape=_seq(["S"], ["S"]), dtypes=["int32"], optional=True,
                   differentiable=False, same_device=False,
                   doc="[N+1] int32 sequence offsets (present: THD layout); 0 = c0 <= c1 <= ... <= cN = T_total; "
                       "on mixed's device, or on the CPU (OPS.md's hot path: its rules then run on the host, "
                       "the GPU kernels copy it without a sync; keep it on the GPU for a CUDA-graph capture)"),
    ],
    outputs=[
        TensorSpec(name="q", role="out", shape=_seq(["B", "T", HQ_EXPR, "dk"], ["T", HQ_EXPR, "dk"]),
                   dtypes="like:mixed", doc="[B, T, Hq, dk], Hq = Hv if repeat_qk else Hk"),
        TensorSpec(name="k", role="out", shape=_seq(["B", "T", HQ_EXPR, "dk"], ["T", HQ_EXPR, "dk"]),
                   dtypes="like:mixed", doc="[B, T, Hq, dk]"),
        TensorSpec(name="v", role="out", shape=_seq(["B", "T", "Hv", "dv"], ["T", "Hv", "dv"]),
                   dtypes="like:mixed", doc="[B, T, Hv, dv] (after conv + silu)"),
        TensorSpec(name="z", role="out", shape=_seq(["B", "T", "Hv", "dv"], ["T", "Hv", "dv"]),
                   dtypes="like:mixed", doc="[B, T, Hv, dv] output gate input (no conv)"),
        TensorSpec(name="g", role="out", shape=_seq(["B", "T", "Hv"], ["T", "Hv"]),
                   dtypes=["float32", "float64"], doc="[B, T, Hv] fp32 log decay (fp64 in reference mode)"),
        TensorSpec(name="beta", role="out", shape=_seq(["B", "T", "Hv"], ["T", "Hv"]),
                   dtypes="like:mixed", doc="[B, T, Hv]"),
        TensorSpec(name="conv_state", role="out", optional=True, differentiable=False,
                   shape=_seq(["B", CONV_DIM_EXPR, "W - 1"], ["S - 1", CONV_DIM_EXPR, "W - 1"]),
                   dtypes="like:mixed", doc="[N, conv_dim, W-1] only with return_conv_state"),
    ],
    params=[
        _HK,
        Param(name="dk", type="int", default=128, min=1, doc="key head dim"),
        Param(name="dv", type="int", default=128, min=1, doc="value head dim"),
        Param(name="repeat_qk", type="bool", default=True,
              doc="repeat_interleave q, k from Hk to Hv heads (Megatron/Qwen3-Next do when Hv > Hk)"),
        _EPS,
        Param(name="return_conv_state", type="bool", default=False,
              doc="also return the final conv_state [N, conv_dim, W-1] for decode"),
    ],
    layouts={_BSHD: "not present(cu_seqlens)", _THD: "present(cu_seqlens)"},
    constraints=[
        _HV_HK,
        _F64_ALL,
        Constraint(expr="nondecreasing(values(cu_seqlens))", when="present(cu_seqlens)",
                   message="cu_seqlens must be nondecreasing"),
        Constraint(expr="min(values(cu_seqlens)) == 0", when="present(cu_seqlens)",
                   message="cu_seqlens must start at 0"),
        Constraint(expr="max(values(cu_seqlens)) == T", when="present(cu_seqlens)",
                   message="cu_seqlens must end at T_total = mixed.shape[0]"),
    ],
    differentiable=True,
    reference="tilekernels.gdn.reference:pre_gated",
    entry="tilekernels.gdn.ops:pre_gated",
    backends=[Backend(
        name="cute", module="tilekernels.gdn.cute_pre_gated", sm=(90, 90), toolchain=["cute"],
        passes=["fwd", "bwd"],
        constraints=[
            Constraint(expr="W <= 33", message="a run's sequence starts are a 64-bit mask of its 32 + W - 1 rows"),
            Constraint(expr="B * T < 2**31", when="not present(cu_seqlens)",
                       message="token rows are int32 (element offsets are 64-bit)"),
        ],
        dtypes=_PRE_GATED_DTYPES,
        doc="CuTe DSL SIMT kernels, sm_90a only. fwd (tilekernels/gdn/cute_pre_gated.py): a thread walks a run of "
            "32 tokens over one 16-byte vector of channels keeping its W-1 conv inputs in registers (each row read "
            "once, through a cp.async ring); THD: a first launch finds each run's sequence starts on the device. "
            "bwd (cute_pre_gated_bwd.py): the forward recomputed in one streaming pass of 128-token spans (conv "
            "window, dx sums and dconv_weight partials in registers), then a fixed-order reduction of the "
            "partial rows (deterministic). H200, Qwen3-Next, 32768 tokens, BSHD rep / norep, THD rep / norep: "
            "fwd 0.494 / 0.422 / 0.499 / 0.430 ms (88-90% of copy), bwd 0.697 / 0.660 / 0.704 / 0.664 ms "
            "(86-91% of the ideal traffic; cutile bwd 2.08 BSHD rep; benchmarks/results/"
            "h200-gdn-cute-pre-gated.txt, h200-gdn-cute-pre-bwd.txt)"),
        Backend(
        name="cutile", module="tilekernels.gdn.cutile_pre_gated", sm=(90, 100), toolchain=["cutile"],
        passes=["fwd", "bwd"],
        constraints=[
            Constraint(expr="B * T * (2*Hk*dk + 2*Hv*dv + 2*Hv + Hv*dk) < 2**31", when="not present(cu_seqlens)",
                       message="the kernels index with int32 (mixed and q, k < 2**31 elements)"),
            Constraint(expr="T * (2*Hk*dk + 2*Hv*dv + 2*Hv + Hv*dk) < 2**31", when="present(cu_seqlens)",
                       message="the kernels index with int32 (mixed and q, k < 2**31 elements)"),
        ],
        dtypes=_PRE_GATED_DTYPES,
        doc="fwd: one launch, grid (token tiles [+ N conv-state rows], 2*Hk + 2*Hv + 1 units); bwd: [THD "
            "sequence bounds,] dpre + dconv_weight partials (tile 0, tiles 1..), dx, fixed-order reduction "
            "(tilekernels/gdn/cutile_pre_gated_bwd.py); cu_seqlens read on the device"),
        _TORCH_FWD_BWD],
)

# a batch of padded rows only, with no state slots at all: the GPU kernels are not written or
# tested for empty state tensors, so the torch reference writes the zero rows
_SLOTS = Constraint(expr="N > 0 or B == 0",
                    message="no state slots (N = 0, every row padded): the torch reference writes the zero rows")

DECODE = OpSpec(
    name="gdn_decode",
    family="gdn",
    doc=("One decode step per sequence, in place: shift conv_state and append the token's q|k|v conv "
         "inputs, conv output = silu(sum over the window), then gdn_pre_gated's prep for T=1, then per "
         "value head h (key head h // (Hv/Hk)): S = S*exp(g); u = beta*(v - S^T k); S = S + k u^T; "
         "o = S^T (scale*q). Row b uses state slot state_indices[b] (slot b without state_indices, "
         "which needs N >= B; slots >= B are then untouched). A slot of -1 is padding: its o row is "
         "zero and no state is read or written. Non-negative state_indices must be distinct "
         "(checked). Forward only."),
    dims=[
        Dim(name="B", doc="tokens = sequences in this step"),
        Dim(name="N", doc="state slots"),
        _Hv, _W,
        Dim(name="dk", min=1, doc="key head dim (bound from ssm_state)"),
        Dim(name="dv", min=1, doc="value head dim (bound from ssm_state)"),
    ],
    inputs=[
        TensorSpec(name="mixed", shape=["B", D_EXPR], dtypes=_FLOAT,
                   doc="[B, D] one new token per sequence, contiguous; sections q|k|v|z|b|a (z unused)"),
        TensorSpec(name="conv_state", role="inout", shape=["N", CONV_DIM_EXPR, "W - 1"], dtypes="like:mixed",
                   differentiable=False,
                   doc="[N, conv_dim, W-1] last W-1 conv inputs per slot, oldest first; updated in place"),
        *_weights(CONV_DIM_EXPR),
        TensorSpec(name="ssm_state", role="inout", shape=["N", "Hv", "dk", "dv"],
                   dtypes=["float32", "bfloat16", "float64"], differentiable=False,
                   doc="[N, Hv, dk, dv] delta-rule state S per slot (fp32, or bf16); updated in place"),
        TensorSpec(name="state_indices", shape=["B"], dtypes=["int32"], optional=True, differentiable=False,
                   doc="[B] int32 slot of each row; -1 = padded row (skipped)"),
    ],
    outputs=[
        TensorSpec(name="o", role="out", shape=["B", "Hv", "dv"], dtypes="like:mixed",
                   doc="[B, Hv, dv] (bf16 for bf16 mixed); zero rows where state_indices == -1"),
    ],
    params=[
        _HK,
        _EPS,
        Param(name="scale", type="float", default=None, nullable=True,
              doc="query scale; None means dk ** -0.5"),
    ],
    constraints=[
        _HV_HK,
        _F64_ALL,
        Constraint(expr="dtype(mixed) != 'float64' or dtype(ssm_state) == 'float64'",
                   message="float64 mixed (reference mode) needs a float64 ssm_state"),
        Constraint(expr="present(state_indices) or N >= B",
                   message="without state_indices row b uses slot b, so N >= B"),
        Constraint(expr="min(values(state_indices)) >= -1 and max(values(state_indices)) < N",
                   when="present(state_indices) and B > 0",
                   message="state_indices must lie in [-1, N)"),
        Constraint(expr="distinct(values(state_indices), -1)", when="present(state_indices)",
                   message="two rows may not update the same state slot"),
        Constraint(expr="not requires_grad", message="gdn_decode is forward-only (in-place state update)"),
    ],
    differentiable=False,
    reference="tilekernels.gdn.reference:decode",
    entry="tilekernels.gdn.ops:decode",
    backends=[Backend(
        name="cute", module="tilekernels.gdn.cute_decode", sm=(90, 90), toolchain=["cute"], passes=["fwd"],
        constraints=[
            Constraint(expr="W >= 2", message="the kernel keeps a conv window of W-1 >= 1 inputs"),
            Constraint(expr="Hv <= 8 * Hk",
                       message="one thread-block cluster (at most 8 CTAs) per key head: Hv/Hk <= 8"),
            Constraint(expr="Hv * dk * dv < 2**31", message="offsets inside one state slot are int32"),
            Constraint(expr="B < 65536", message="the rows are the grid's y extent (at most 65535)"),
            _SLOTS,
        ],
        dtypes={"mixed": ["bfloat16", "float32"], "conv_weight": ["bfloat16", "float32"],
                "A_log": ["float32"], "dt_bias": ["float32"], "ssm_state": ["float32", "bfloat16"]},
        doc="CuTe DSL kernels, sm_90a only. Small batches (B * Hk below cute_decode.RING_FROM): "
            "tilekernels/gdn/cute_decode.py, grid (Hv * ceil(dv/BV), B), one CTA per (row, value head, BV state "
            "columns) holding its [dk, BV] state slice in registers, one cluster per (row, key head) orders the "
            "q|k conv-window shift. Larger ones: cute_decode_ring.py, persistent CTAs over (row, key head) items, "
            "the state streamed through a TMA ring by a producer warp (its limits: 16-byte aligned state and rows, "
            "dk <= 256; else the register kernel). H200, graph-replayed, fp32 state 3.8 / 37.8 / 290 us at "
            "B = 1 / 32 / 256 (session 17, benchmarks/results/gdn.md) against cutile's 9.4 / 68 / 407 "
            "(session 7); other GPUs, Hv/Hk > 8 or no CuTe DSL take cutile"),
        Backend(
            name="cutile", module="tilekernels.gdn.cutile_decode", sm=(90, 100), toolchain=["cutile"], passes=["fwd"],
            constraints=[
                Constraint(expr="W >= 2", message="the kernel keeps a conv window of W-1 >= 1 inputs"),
                Constraint(expr="N * Hv * dk * dv < 2**31 and N * (2*Hk*dk + Hv*dv) * (W - 1) < 2**31 "
                                "and B * (2*Hk*dk + 2*Hv*dv + 2*Hv) < 2**31",
                           message="the kernel indexes with int32 (every tensor < 2**31 elements)"),
                _SLOTS,
            ],
            dtypes={"mixed": ["bfloat16", "float32"], "conv_weight": ["bfloat16", "float32"],
                    "A_log": ["float32"], "dt_bias": ["float32"], "ssm_state": ["float32", "bfloat16"]},
            doc="one launch per step, grid (B, Hk): a block owns one key head's conv window and its Hv/Hk "
                "value heads' state tiles (run and tested on the H200; compiled for sm_100 in CI)"),
        _TORCH_FWD],
)

SPECS = [PRE_GATED, DECODE]
