"""Context-parallel (THD, packed sequences) op specs. See ../shared/OPS.md,
section "Context-parallel all-to-all for packed sequences (THD)".

cp ranks; N packed sequences with global ``cu_seqlens [N+1]`` (int32/int64, on
any device: ``same_device=False``); every length a multiple of 2*cp. Zigzag
layout: rank r holds chunks r and 2cp-1-r (each L_i/(2cp) tokens) of every
sequence, in sequence order. ``split_sections`` are feature section widths
(q|k|v|z|b|a), each a multiple of cp; head-parallel rank r owns the r-th 1/cp
of every section.

``thd_cp_to_hp`` / ``thd_hp_to_cp`` are collectives: autograd.Functions, not
custom ops. Their ``cp`` param is optional: None means "the group's size",
resolved before any rule runs (``Param.resolve``); without an initialised
process group it stays None, the cp rules are skipped and the backend's
``requires=["distributed"]`` refuses the call.

Backends of the collectives: ``cutile`` (pack/unpack kernels that compute every row's
source row from cu_seqlens on the device: a GPU cu_seqlens is never read on the host, the
value rules run on the device as async checks) before ``torch`` (index-map gathers cached
per cu_seqlens value: it reads cu_seqlens on the host once per call, the Backend's
``host_values``; for a GPU cu_seqlens that is one sync). The collective's send sizes do not
depend on cu_seqlens (every rank sends Tl x D/cp to every rank): only the token order does.
``thd_cp_a2a_perm``'s output length T = cu_seqlens[-1] is a host fact: ``total_tokens``
passes it (then a GPU cu_seqlens is not read on the host), else it is read (one sync).
"""
from __future__ import annotations

from .schema import Backend, Constraint, Dim, OpSpec, Param, TensorSpec

_FLOAT = ["bfloat16", "float16", "float32", "float64"]
_HAS_CP = "cp is not None"
_HAS_SECTIONS = "split_sections is not None"

_N1 = Dim(name="N1", min=1, doc="len(cu_seqlens) = N + 1")

_CU = TensorSpec(
    name="cu_seqlens", shape=["N1"], dtypes=["int32", "int64"], same_device=False, differentiable=False,
    doc="[N+1] global cumulative sequence lengths (0, L_0, L_0+L_1, ...), any device")

_SECTIONS = Param(
    name="split_sections", type="ints", nullable=True, default=None,
    doc="feature section widths (e.g. q,k,v,z,b,a), each a multiple of cp; "
        "None = one section (thd_cp_a2a_perm: no feature maps)")

_CU_RULES = [
    Constraint(expr="min(values(cu_seqlens)) == 0", message="cu_seqlens starts at 0"),
    Constraint(expr="nondecreasing(values(cu_seqlens))", message="cu_seqlens is nondecreasing"),
]


def _cp_rules(gate: str | None) -> list[Constraint]:
    """Length and section rules that need cp (gated when cp may be None)."""
    both = f"{gate} and {_HAS_SECTIONS}" if gate else _HAS_SECTIONS
    return [
        Constraint(expr="all_div(seqlens(cu_seqlens), 2*cp)", when=gate,
                   message="every sequence length is a multiple of 2*cp (the zigzag's 2*cp chunks)"),
        Constraint(expr="len(split_sections) > 0 and min(split_sections) > 0", when=_HAS_SECTIONS,
                   message="split_sections lists positive widths"),
        Constraint(expr="all_div(split_sections, cp)", when=both,
                   message="every section width is a multiple of cp (each hp rank owns 1/cp of it)"),
    ]


def _a2a_spec(name: str, to_hp: bool) -> OpSpec:
    # cp side x [Tl, D]; hp side x [T, Dh] with Dh = D/cp
    rows, cols = ("Tl", "D") if to_hp else ("T", "Dh")
    if to_hp:
        shape_rules = [
            Constraint(expr="Tl * cp == max(values(cu_seqlens))", when=_HAS_CP,
                       message="x_local holds T_global/cp tokens (T_global = cu_seqlens[-1])"),
            Constraint(expr="D == sum(split_sections)", when=_HAS_SECTIONS,
                       message="the sections tile the feature dim"),
            Constraint(expr="D % cp == 0", when=_HAS_CP, message="each hp rank owns D/cp features"),
        ]
        out_shape = ["Tl * cp", "D // cp"]
        doc = ("cp -> hp all_to_all for packed sequences: x_local [T_global/cp, D] (this rank's zigzag "
               "tokens, all features, section-major) -> [T_global, D/cp] (all tokens in natural packed "
               "order, this rank's 1/cp of every section). Exactly one all_to_all_single, with the "
               "section split and the token reordering fused into one gather before and one after. "
               "Backward: thd_hp_to_cp. Bitwise equal to the per-sequence, per-section all_to_all.")
    else:
        shape_rules = [
            Constraint(expr="T == max(values(cu_seqlens))",
                       message="x holds all T_global tokens (T_global = cu_seqlens[-1])"),
            Constraint(expr="Dh * cp == sum(split_sections)", when=f"{_HAS_CP} and {_HAS_SECTIONS}",
                       message="x holds 1/cp of every section (split_sections are the full widths)"),
        ]
        out_shape = ["T // cp", "Dh * cp"]
        doc = ("hp -> cp all_to_all for packed sequences, the inverse of thd_cp_to_hp: x [T_global, D/cp] "
               "(natural order, this rank's 1/cp of every section) -> [T_global/cp, D] (this rank's zigzag "
               "tokens, all features, section-major). Exactly one all_to_all_single, one gather before "
               "and one after. Backward: thd_cp_to_hp. Bitwise equal to the per-sequence, per-section "
               "all_to_all.")
    return OpSpec(
        name=name,
        family="cp",
        doc=doc,
        dims=[Dim(name=rows, doc="tokens on this side"), Dim(name=cols, min=1, doc="features on this side"), _N1],
        inputs=[
            TensorSpec(name="x", shape=[rows, cols], dtypes=_FLOAT,
                       doc=f"[{rows}, {cols}] contiguous, " + ("cp side" if to_hp else "hp side")),
            _CU,
        ],
        outputs=[TensorSpec(name="out", role="out", shape=out_shape, dtypes="like:x",
                            doc="the other side of the all_to_all")],
        params=[
            _SECTIONS,
            Param(name="group", type="object", default=None, instance_of="torch.distributed:ProcessGroup",
                  doc="the cp torch.distributed process group (None = the default group)"),
            Param(name="cp", type="int", nullable=True, default=None, min=1,
                  resolve="tilekernels.cp.ops:resolve_cp",
                  doc="cp size; None = the group's size (resolved before any rule runs), else it must equal it"),
        ],
        constraints=_CU_RULES + _cp_rules(_HAS_CP) + shape_rules,
        differentiable=True,
        reference=f"tilekernels.cp.reference:{name}",
        entry=f"tilekernels.cp.ops:{name}",
        backends=[
            Backend(name="cutile", module="tilekernels.cp.cutile_pack", requires=["distributed"], sm=(90, 100),
                    toolchain=["cutile"], dtypes={"x": ["bfloat16", "float16", "float32"]},
                    constraints=[Constraint(expr=f"{rows} * {cols} < 2**31",
                                            message="the kernels index with int32 (every tensor < 2**31 elements)")],
                    doc="cuTile pack (section split / rank-major rows) and unpack kernels around one "
                        "all_to_all_single; source rows computed from cu_seqlens on the device (no host "
                        "read); float64 runs on torch"),
            Backend(name="torch", module="tilekernels.cp.ops", requires=["distributed"], host_values=["cu_seqlens"],
                    runs_reference=False,
                    doc="torch gathers through cached index maps around one torch.distributed.all_to_all_single; "
                        "reads cu_seqlens on the host once per call"),
        ],
    )


A2A_PERM = OpSpec(
    name="thd_cp_a2a_perm",
    family="cp",
    doc=("Index maps of the THD cp<->hp all_to_all. token_perm[j] = natural packed index of the j-th "
         "rank-major zigzag token (rank 0's local tokens, then rank 1's, ...); token_inv its inverse "
         "(rank-major position of natural token p). feature_perm[k] = section-major column of the k-th "
         "rank-major column (for r = 0..cp-1, the r-th 1/cp of every section); feature_inv its inverse. "
         "Not differentiable."),
    dims=[_N1,
          Dim(name="T", doc="cu_seqlens[-1]: global tokens (not bound by a shape)"),
          Dim(name="D", doc="sum(split_sections) (not bound by a shape)")],
    inputs=[_CU],
    outputs=[
        TensorSpec(name="token_perm", role="out", shape=["T"], dtypes=["int64"], differentiable=False,
                   doc="[T] natural index of each rank-major token"),
        TensorSpec(name="token_inv", role="out", shape=["T"], dtypes=["int64"], differentiable=False,
                   doc="[T] rank-major position of each natural token"),
        TensorSpec(name="feature_perm", role="out", shape=["D"], dtypes=["int64"], optional=True,
                   differentiable=False, doc="[D] section-major column of each rank-major column"),
        TensorSpec(name="feature_inv", role="out", shape=["D"], dtypes=["int64"], optional=True,
                   differentiable=False, doc="[D] rank-major position of each section-major column"),
    ],
    params=[Param(name="cp", type="int", required=True, min=1, doc="context-parallel size"), _SECTIONS,
            Param(name="total_tokens", type="int", nullable=True, default=None, min=0,
                  doc="T = cu_seqlens[-1] when the caller knows it: a GPU cu_seqlens is then not read on "
                      "the host (sync-free); None reads it (one sync for a GPU cu_seqlens)")],
    constraints=_CU_RULES + _cp_rules(None) + [
        Constraint(expr="total_tokens == max(values(cu_seqlens))", when="total_tokens is not None",
                   message="total_tokens is cu_seqlens[-1]"),
        # the maps are int64 tensors of T and D entries: their byte counts (8 T, 8 D) must be int64s (past that
        # torch's allocation overflows with an error naming neither op nor argument)
        Constraint(expr="max(values(cu_seqlens)) < 2**60",
                   message="T = cu_seqlens[-1] < 2**60 (token maps of 8 T bytes)"),
        Constraint(expr="sum(split_sections) < 2**60", when=_HAS_SECTIONS,
                   message="sum(split_sections) < 2**60 (feature maps of 8 D bytes)"),
    ],
    differentiable=False,
    reference="tilekernels.cp.reference:thd_cp_a2a_perm",
    entry="tilekernels.cp.ops:thd_cp_a2a_perm",
    backends=[Backend(name="torch", module="tilekernels.cp.ops", passes=["fwd"], runs_reference=False)],
)

CP_TO_HP = _a2a_spec("thd_cp_to_hp", to_hp=True)
HP_TO_CP = _a2a_spec("thd_hp_to_cp", to_hp=False)

SPECS = [A2A_PERM, CP_TO_HP, HP_TO_CP]
