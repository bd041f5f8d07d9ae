"""The pydantic schema every op spec is written in.

An :class:`OpSpec` declares an op completely: its symbolic dims, every tensor's
shape (as dim expressions), allowed dtypes, role and contiguity, typed scalar
params, cross-dim and value constraints, whether it is differentiable, where its
torch reference and functional entry live, and, per backend, what that backend
additionally requires (SM range, toolchain, dtypes, tiling limits).

Expressions (dims in shapes, constraints, layout conditions) use the small
language of :mod:`specs.expr`. Inside constraints these helpers exist:
``present(t)``, ``ndim(t)``, ``dtype(t)``, ``values(t)`` (a tensor's integer
values as a tuple), ``seqlens(t)`` (the differences of a cu_seqlens tensor),
``all_div(xs, k)``, ``nondecreasing(xs)``, ``distinct(xs, *ignored)``,
``first(xs)``, ``last(xs)``,
``requires_grad`` (any input needs a
gradient), plus ``len``, ``sum``, ``min``, ``max``, ``all``, ``any``, ``abs``.
"""
from __future__ import annotations

import math
import re
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from . import expr as _expr

DType = Literal[
    "bfloat16", "float16", "float32", "float64", "int32", "int64", "uint8",
    "float8_e4m3fn", "bool",
]
BackendName = Literal["torch", "cutile", "cute"]
Pass = Literal["fwd", "bwd"]
Family = Literal["mhc", "moe", "gdn", "cp"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENTRY = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$")

# Joins a model's problems in its ValueError (tk-spec-lint splits on it, one problem a line): a newline, since a
# problem's own text may hold "; ".
PROBLEM_SEP = "\n"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Dim(_Model):
    """A symbolic dim, bound from the first tensor whose shape names it bare.

    Its size must lie in [min, max] (0 <= min <= max) and be a multiple of
    ``multiple_of`` (>= 1)."""
    name: str
    min: int = 0
    max: Optional[int] = None
    multiple_of: int = 1
    doc: str = ""

    @field_validator("name")
    @classmethod
    def _ident(cls, v: str) -> str:
        if not _IDENT.match(v):
            raise ValueError(f"dim name {v!r} is not an identifier")
        return v

    @model_validator(mode="after")
    def _range(self):
        problems = []
        if self.min < 0:
            problems.append(f"dim {self.name}: min {self.min} is negative")
        if self.max is not None and self.min > self.max:
            problems.append(f"dim {self.name}: min {self.min} > max {self.max}")
        if self.multiple_of <= 0:
            problems.append(f"dim {self.name}: multiple_of {self.multiple_of} must be >= 1")
        if problems:
            raise ValueError(PROBLEM_SEP.join(problems))
        return self


Shape = list[Union[str, int]]


class TensorSpec(_Model):
    """One tensor argument or result.

    ``shape`` lists dim expressions (a bare dim name binds it); a dict maps a
    layout name (see OpSpec.layouts) to that layout's shape. ``dtypes`` lists the
    allowed dtypes, or ``"like:<tensor>"`` for "the same dtype as that tensor".
    """
    name: str
    shape: Union[Shape, dict[str, Shape]]
    dtypes: Union[list[DType], str]
    role: Literal["in", "out", "inout"] = "in"
    optional: bool = False
    contiguous: bool = True
    same_device: bool = True
    differentiable: bool = True
    # metadata callers often hold as a Python list (TE's GroupedLinear takes m_splits as List[int], DeepEP
    # returns its per-expert counts as one): a sequence of ints is accepted and made a CPU tensor of the
    # first dtype before validation
    from_ints: bool = False
    doc: str = ""

    @field_validator("name")
    @classmethod
    def _ident(cls, v: str) -> str:
        if not _IDENT.match(v):
            raise ValueError(f"tensor name {v!r} is not an identifier")
        return v

    @field_validator("dtypes")
    @classmethod
    def _dtypes(cls, v):
        if isinstance(v, str) and not re.match(r"^like:[A-Za-z_]\w*$", v):
            raise ValueError(f"dtypes must be a list or 'like:<tensor>', got {v!r}")
        if isinstance(v, list) and not v:
            raise ValueError("dtypes must not be empty")
        return v

    @model_validator(mode="after")
    def _from_ints(self):
        if self.from_ints and (self.role != "in" or not isinstance(self.dtypes, list)
                               or not self.dtypes[0].startswith("int") or self.same_device):
            raise ValueError(f"tensor {self.name}: from_ints needs role 'in', an integer dtype list first and "
                             f"same_device=False (the list becomes a CPU tensor), got role {self.role!r}, dtypes "
                             f"{self.dtypes!r}, same_device={self.same_device}")
        return self

    def shape_for(self, layout: Optional[str]) -> Shape:
        if isinstance(self.shape, dict):
            if layout not in self.shape:
                raise KeyError(layout)
            return self.shape[layout]
        return self.shape

    def all_shapes(self) -> list[Shape]:
        return list(self.shape.values()) if isinstance(self.shape, dict) else [self.shape]


_PARAM_TYPES = {"int": int, "float": (int, float), "bool": bool, "str": str}


class Param(_Model):
    """A typed parameter with default and range.

    ``ints`` is a list/tuple of ints (min/max bound every element); ``object``
    is passed through (e.g. a process group), checked only to be None or an
    instance of ``instance_of`` ("module:Class") where given. A float param must be
    finite (no NaN / inf) unless the spec says ``finite=False``. The default of
    a param that is not required must pass the same checks as a passed value
    (registry.validate's ``_check_param``): its type (a bool is not an int, an
    int is a float), [min, max], choices, finiteness, None only if nullable.
    """
    name: str
    type: Literal["int", "float", "bool", "str", "ints", "object"]
    default: Any = None
    required: bool = False
    nullable: bool = False
    choices: Optional[list[Any]] = None
    # bounds: ints for an int / ints param (a whole bound; messages then print "[1, 64]", not "[1.0, 64.0]"),
    # floats for a float param
    min: Optional[float] = None
    max: Optional[float] = None
    finite: bool = True
    # "module:function" (params dict -> value or None): fills a None before the checks; a value given must equal
    # what it derives (when it derives one), checked before any rule reads the param
    resolve: Optional[str] = None
    instance_of: Optional[str] = None  # an object param's class, "module:Class" (skipped if that cannot import)
    doc: str = ""

    @field_validator("min", "max")
    @classmethod
    def _whole_int_bounds(cls, v, info):
        if v is not None and info.data.get("type") in ("int", "ints") and math.isfinite(v) and v == int(v):
            return int(v)
        return v

    @model_validator(mode="after")
    def _default_fits(self):
        if not _IDENT.match(self.name):
            raise ValueError(f"param name {self.name!r} is not an identifier")
        problems = [f"param {self.name}: {b} {v} is NaN" for b, v in (("min", self.min), ("max", self.max))
                    if v is not None and math.isnan(v)]
        if self.min is not None and self.max is not None and self.min > self.max:
            problems.append(f"param {self.name}: min {self.min} > max {self.max}")
        if self.instance_of is not None and (self.type != "object" or not _ENTRY.match(self.instance_of)):
            problems.append(f"param {self.name}: instance_of {self.instance_of!r} needs type object and "
                            "a 'module:Class' path")
        if (self.min is not None or self.max is not None) and self.type not in ("int", "float", "ints"):
            problems.append(f"param {self.name}: min/max apply to int, float and ints params, not {self.type}")
        if not self.required and self.type != "object":
            problems += self._default_problems()
        if problems:
            raise ValueError(PROBLEM_SEP.join(problems))
        return self

    def _default_problems(self) -> list[str]:
        """What the registry would refuse about the default, were it passed (mirrors
        registry.validate._check_param)."""
        d, what = self.default, f"param {self.name}: default {self.default!r}"
        if d is None:
            return [] if self.nullable else [f"{what} is not of type {self.type} (nullable=True allows None)"]
        if self.type == "ints":
            if not isinstance(d, (list, tuple)) or any(not isinstance(e, int) or isinstance(e, bool) for e in d):
                return [f"{what} is not a list of ints"]
            values = list(d)
        else:
            if isinstance(d, bool) and self.type in ("int", "float"):
                return [f"{what} is not of type {self.type} (a bool is not a number)"]
            if not isinstance(d, _PARAM_TYPES[self.type]):
                return [f"{what} is not of type {self.type}"]
            if self.type == "float" and self.finite and isinstance(d, float) and not math.isfinite(d):
                return [f"{what} is not finite (set finite=False to allow NaN / inf)"]
            if self.choices is not None and d not in self.choices:
                return [f"{what} not in choices {self.choices}"]
            values = [d] if self.type in ("int", "float") else []
        out = []
        if self.min is not None and any(v < self.min for v in values):
            out.append(f"{what} is below min {self.min}")
        if self.max is not None and any(v > self.max for v in values):
            out.append(f"{what} is above max {self.max}")
        return out


# The least eps a spec takes (an l2norm's, an RMS norm's, a Sinkhorn sum's): fp32's smallest normal number. The
# kernels add eps in fp32 with denormals flushed to zero, so a smaller one acts as 0 (0 / 0 and 1 / 0 on an all-zero
# row); 1 / EPS_MIN (8.5e37) is still finite in fp32.
EPS_MIN = 2.0 ** -126


def eps_param(name: str, what: str, default: float = 1e-6) -> Param:
    """An epsilon param (``what``: where the op adds it), bounded below by ``EPS_MIN``."""
    return Param(name=name, type="float", default=default, min=EPS_MIN,
                 doc=f"{what}; >= 2**-126, fp32's smallest normal (a smaller eps acts as 0 in the kernels)")


class Constraint(_Model):
    """A boolean expression that must hold; ``when`` (optional) gates it."""
    expr: str
    message: str = ""
    when: Optional[str] = None

    @field_validator("expr", "when")
    @classmethod
    def _parses(cls, v):
        if v is not None:
            _expr.parse(v)
        return v


class Backend(_Model):
    """What a backend adds on top of the op's own contract.

    ``module`` is imported to register the backend's kernels (see
    ``tilekernels._glue.kernel``). ``passes`` says which passes it implements:
    a call that needs a gradient only uses a backend that has ``bwd``.
    ``sm`` is the inclusive range of compute capabilities (major*10+minor).
    ``constraints`` and ``dtypes`` are the backend's own limits (tile sizes,
    alignment, n <= 8, ...), never the op's. ``tiling`` records fixed tile
    parameters for documentation and cache keys (e.g. TILE_SIZE=1).
    """
    name: BackendName
    module: str
    passes: list[Pass] = Field(default_factory=lambda: ["fwd", "bwd"])
    sm: Optional[tuple[int, int]] = None
    toolchain: list[Literal["cutile", "cute"]] = Field(default_factory=list)
    constraints: list[Constraint] = Field(default_factory=list)
    dtypes: dict[str, list[DType]] = Field(default_factory=dict)
    tiling: dict[str, int] = Field(default_factory=dict)
    requires: list[Literal["distributed"]] = Field(default_factory=list)
    # input tensors this backend reads on the host by design (its entry reads them itself,
    # once per call; see OpSpec.host_values for tensors every backend reads there)
    host_values: list[str] = Field(default_factory=list)
    # the torch backend only: True when its kernels compute the op's reference (what the registry's explain text
    # and fallback log then call "the torch reference"); False: torch code of its own (the CP collectives'
    # index-map gathers around one all_to_all), which those texts name as such
    runs_reference: bool = True
    doc: str = ""

    @model_validator(mode="after")
    def _reference_flag(self) -> "Backend":
        if self.name != "torch" and not self.runs_reference:
            raise ValueError(f"backend {self.name}: runs_reference is the torch backend's field")
        return self

    @field_validator("module")
    @classmethod
    def _mod(cls, v: str) -> str:
        if not _ENTRY.match(v):
            raise ValueError(f"backend module {v!r} is not a dotted module path")
        return v


class OpSpec(_Model):
    """The full contract of one op (see ../shared/OPS.md).

    ``host_values`` names input tensors the op reads on the host by design: the
    registry copies them to the host once per call and hands the kernels that copy.
    A tensor only some backends read on the host is named in those backends'
    ``Backend.host_values`` instead (the CP collectives' torch backend: cu_seqlens):
    the registry leaves it where it is (its value rules run on the device for a GPU
    tensor) and that backend's entry reads it; the registry copies it up front only
    when every backend of the op names it. Every other op's rules on
    tensor values run on the device (no host sync; see registry.validate).
    """
    name: str
    family: Family
    doc: str
    dims: list[Dim]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    params: list[Param] = Field(default_factory=list)
    layouts: dict[str, str] = Field(default_factory=dict)
    constraints: list[Constraint] = Field(default_factory=list)
    differentiable: bool = False
    reference: str
    entry: str
    backends: list[Backend]
    host_values: list[str] = Field(default_factory=list)

    @field_validator("reference", "entry")
    @classmethod
    def _entry(cls, v: str) -> str:
        if not _ENTRY.match(v) or ":" not in v:
            raise ValueError(f"{v!r} is not of the form 'package.module:function'")
        return v

    @field_validator("layouts")
    @classmethod
    def _layouts(cls, v):
        for cond in v.values():
            _expr.parse(cond)
        return v

    @model_validator(mode="after")
    def _consistent(self):
        problems = consistency_problems(self)
        if problems:
            raise ValueError(PROBLEM_SEP.join(problems))
        return self

    # convenience
    def input(self, name: str) -> TensorSpec:
        for t in self.inputs:
            if t.name == name:
                return t
        raise KeyError(name)

    def backend(self, name: str) -> Backend:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)


CONSTRAINT_HELPERS = frozenset({
    "present", "ndim", "dtype", "values", "seqlens", "all_div", "nondecreasing", "distinct", "first", "last",
    "requires_grad", "len", "sum", "min", "max", "all", "any", "abs",
})


def _reads_tensor_values(e: str, tensors: set) -> bool:
    import ast

    try:
        tree = _expr.parse(e)
    except _expr.ExprError:
        return False
    for node in ast.walk(tree.body):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("values", "seqlens"):
                return True
            if node.func.id not in ("present", "ndim", "dtype") and any(
                    isinstance(a, ast.Name) and a.id in tensors for a in node.args):
                return True
    return False


def consistency_problems(spec: OpSpec) -> list[str]:
    """Static checks: unique names, none shadowing an expression helper; every dim/param/tensor an expression
    (shape entry, constraint and its ``when``, the op's and every backend's; layout) names exists, constraints
    and layouts naming inputs only (outputs do not exist when they run); ``like:`` dtypes and backend dtype limits
    naming inputs (the registry checks those); every dim an input's shape expression names bound bare by some
    input; no negative shape entry."""
    out: list[str] = []
    dim_names = [d.name for d in spec.dims]
    tensor_names = [t.name for t in spec.inputs] + [t.name for t in spec.outputs]
    param_names = [p.name for p in spec.params]
    first_opt = next((i for i, t in enumerate(spec.inputs) if t.optional), len(spec.inputs))
    late = [t.name for t in spec.inputs[first_opt:] if not t.optional]
    if late:  # the generated entry takes required inputs first, the registry passes spec order
        out.append(f"required inputs {late} follow an optional input; optional inputs go last")
    for kind, seq in (("dim", dim_names), ("tensor", tensor_names), ("param", param_names)):
        dup = {x for x in seq if seq.count(x) > 1}
        if dup:
            out.append(f"duplicate {kind} names {sorted(dup)}")
    clash = set(dim_names) & (set(tensor_names) | set(param_names)) | (set(tensor_names) & set(param_names))
    if clash:
        out.append(f"names used for more than one of dim/tensor/param: {sorted(clash)}")
    input_names = {t.name for t in spec.inputs}
    # what expressions see (outputs never enter their environment: they may take any name)
    if shadow := sorted((set(dim_names) | input_names | set(param_names)) & CONSTRAINT_HELPERS):
        out.append(f"dim/input/param names {shadow} shadow the expression helpers of the same names")
    known_scalars = set(dim_names) | set(param_names)
    # what a constraint or layout sees: the call's inputs (outputs do not exist yet when it runs)
    known = known_scalars | input_names | CONSTRAINT_HELPERS
    for name in spec.host_values:
        if name not in input_names:
            out.append(f"host_values names {name!r}, which is not an input tensor")
    for b in spec.backends:
        for name in b.host_values:
            if name not in input_names:
                out.append(f"backend {b.name}: host_values names {name!r}, which is not an input tensor")
    for p in spec.params:
        if p.resolve is not None and not (_ENTRY.match(p.resolve) and ":" in p.resolve):
            out.append(f"param {p.name}: resolve {p.resolve!r} is not of the form 'package.module:function'")
    layouts = set(spec.layouts)
    for t in spec.inputs + spec.outputs:
        if isinstance(t.shape, dict):
            if set(t.shape) != layouts:
                out.append(f"tensor {t.name}: shape layouts {sorted(t.shape)} != op layouts {sorted(layouts)}")
        for shape in t.all_shapes():
            for d in shape:
                if isinstance(d, int):
                    if d < 0:
                        out.append(f"tensor {t.name}: shape entry {d} is negative")
                    continue
                try:  # parse refuses a division by a constant zero ("C // 0") and unbounded constants
                    named = _expr.names(d)
                except _expr.ExprError as e:
                    out.append(f"tensor {t.name}: {e}")
                    continue
                if not named and not (isinstance(v := _expr.evaluate(d, {}), int) and v >= 0):
                    out.append(f"tensor {t.name}: shape entry {d!r} evaluates to {v!r}, not a size >= 0")
                if unknown := sorted(named - known_scalars):
                    out.append(f"tensor {t.name}: shape entry {d!r} names unknown dims {unknown}")
        if isinstance(t.dtypes, str) and (t.dtypes[5:] not in input_names or t.dtypes[5:] == t.name):
            out.append(f"tensor {t.name}: dtypes {t.dtypes!r} names no other input tensor (a dtype is taken "
                       "from an input of the call)")
    # per layout: the entries an input's shape has bare (they bind dims) and the dims its other entries name (an
    # output's shape is allocated, not checked)
    for lay in spec.layouts or [None]:
        bare, shaped = set(), set()
        for t in spec.inputs:
            for d in t.shape if isinstance(t.shape, list) else t.shape.get(lay, []):
                if isinstance(d, str) and _IDENT.match(d):
                    bare.add(d)
                elif isinstance(d, str):
                    try:
                        shaped |= _expr.names(d)
                    except _expr.ExprError:
                        pass  # reported above
        if unbound := sorted((shaped & set(dim_names)) - bare):
            where = f" in layout {lay!r}" if lay is not None else ""
            out.append(f"dims {unbound} appear in input shape expressions{where} but no input's shape there has them "
                       "as an entry of their own, so no call binds them and the shapes that name them go unchecked")
    for t in spec.inputs:
        if t.role == "out":
            out.append(f"input {t.name} has role 'out' (outputs go in 'outputs')")
    exprs = [(f"constraint {c.expr!r}", c.expr) for c in spec.constraints]
    exprs += [(f"constraint {c.expr!r} (when)", c.when) for c in spec.constraints if c.when]
    exprs += [(f"layout {k!r}", v) for k, v in spec.layouts.items()]
    for b in spec.backends:
        exprs += [(f"backend {b.name} constraint {c.expr!r}", c.expr) for c in b.constraints]
        exprs += [(f"backend {b.name} constraint {c.expr!r} (when)", c.when) for c in b.constraints if c.when]
        for tname in b.dtypes:
            if tname not in input_names:
                out.append(f"backend {b.name}: dtypes restrict {tname!r}, which is not an input tensor (the registry "
                           "checks the inputs' dtypes; limit an output's through a constraint on what sets it)")
        if b.sm is not None and b.sm[0] > b.sm[1]:
            out.append(f"backend {b.name}: sm range {b.sm} is empty")
        tensors_in = {t.name for t in spec.inputs}
        for c in b.constraints:
            if any(_reads_tensor_values(e, tensors_in) for e in (c.expr, c.when) if e):
                out.append(f"backend {b.name} constraint {c.expr!r} reads tensor values: a backend's choice "
                           "may not depend on data (it would need a host sync)")
        if b.name != "torch" and not b.toolchain:
            out.append(f"backend {b.name}: a GPU backend must name its toolchain")
    for what, e in exprs:
        try:
            unknown = _expr.names(e) - known
        except _expr.ExprError as err:
            out.append(f"{what}: {err}")
            continue
        if outs := sorted(unknown & set(tensor_names)):
            out.append(f"{what} names output tensors {outs}: constraints and layouts see the call's inputs only")
        if unknown := unknown - set(tensor_names):
            out.append(f"{what} names unknown {sorted(unknown)}")
    bnames = [b.name for b in spec.backends]
    if "torch" not in bnames:
        out.append("every op needs the torch backend (the reference fallback)")
    if len(set(bnames)) != len(bnames):
        out.append(f"duplicate backends {bnames}")
    if spec.differentiable:
        for b in spec.backends:
            if b.name == "torch" and "bwd" not in b.passes:
                out.append("differentiable op whose torch backend has no bwd")
    return out
