"""tk-spec-lint: clean on the shipped specs, precise on broken ones (written to tmp_path)."""
import json
import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

import registry
from registry import capabilities as caps
from tools import _common as C
from tools import spec_lint


def base(name="lint_test_op", **over):
    d = registry.get("mhc_h_aggregate").spec.model_dump(mode="json")
    d["name"] = name
    # only the torch backend: the shipped GPU backend registers kernels for its own op name
    d["backends"] = [b for b in d["backends"] if b["name"] == "torch"]
    d.update(over)
    return d


def write_json(tmp_path, obj, fname="specs.json"):
    p = tmp_path / fname
    p.write_text(json.dumps(obj))
    return str(p)


def write_py(tmp_path, body, fname="my_specs.py"):
    p = tmp_path / fname
    p.write_text(body)
    return str(p)


def lint(capsys, *argv):
    rc = spec_lint.main(list(argv))
    return rc, capsys.readouterr().out


def test_shipped_specs_are_clean(capsys):
    rc, out = lint(capsys)
    assert rc == 0, out
    n = len(registry.names())
    assert f"{n} spec(s)" in out and "0 error(s)" in out


def test_clean_user_files_pass(tmp_path, capsys):
    rc, out = lint(capsys, write_json(tmp_path, [base("a_op"), base("b_op")]),
                   write_py(tmp_path, f"SPECS = [{base('c_op')!r}]\n".replace("null", "None")))
    assert rc == 0, out
    assert "3 spec(s) from 2 source(s): 0 error(s)" in out


def test_duplicate_names_across_files(tmp_path, capsys):
    a = write_json(tmp_path, base("dup_op"), "a.json")
    b = write_py(tmp_path, "from specs.mhc import SPECS as _S\n"
                           "d = _S[0].model_copy(update={'name': 'dup_op'})\nSPECS = [d]\n")
    rc, out = lint(capsys, a, b)
    assert rc == 1
    assert "my_specs.py: dup_op: error: duplicate op name (also defined in" in out and "a.json" in out


def test_duplicate_within_one_file(tmp_path, capsys):
    rc, out = lint(capsys, write_json(tmp_path, [base("same"), base("same")]))
    assert rc == 1 and "specs.json: same: error: duplicate op name" in out


def test_unknown_dim_in_a_shape(tmp_path, capsys):
    d = base("bad_dim")
    d["inputs"][0]["shape"] = ["T", "n", "Q"]
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1
    assert "bad_dim: error:" in out and "names unknown dims ['Q']" in out and "tensor x" in out


def test_optional_input_before_a_required_one(tmp_path, capsys):
    """The generated entry takes required inputs first while the registry passes spec order,
    so an optional input in the middle would be misbound: the linter refuses such a spec."""
    d = base("opt_first")
    d["inputs"][0]["optional"] = True
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1
    assert "opt_first: error:" in out and "required inputs ['h_pre'] follow an optional input" in out


def test_unparseable_constraint(tmp_path, capsys):
    d = base("bad_expr")
    d["constraints"] = [{"expr": "T % 2 ==", "message": "broken"}]
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1
    assert "bad_expr: error: constraints.0.expr:" in out and "cannot parse" in out


def test_constraint_naming_unknown_param(tmp_path, capsys):
    d = base("bad_param")
    d["constraints"] = [{"expr": "iters > 0"}]
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1 and "bad_param" in out and "names unknown ['iters']" in out


def test_reference_that_does_not_import(tmp_path, capsys):
    rc, out = lint(capsys, write_json(tmp_path, base("bad_ref", reference="tilekernels.no_such_mod:f")))
    assert rc == 1
    assert "bad_ref: error: reference 'tilekernels.no_such_mod:f' does not import" in out


def test_entry_missing_attribute_and_bad_signature(tmp_path, capsys):
    rc, out = lint(capsys, write_json(tmp_path, [
        base("no_attr", entry="tilekernels.mhc.ops:nope"),
        base("no_backend_kw", entry="tilekernels.mhc.reference:h_aggregate"),
    ]))
    assert rc == 1
    assert "no_attr: error: entry 'tilekernels.mhc.ops:nope' does not import: AttributeError" in out
    assert "no_backend_kw: error: entry 'tilekernels.mhc.reference:h_aggregate': signature" in out


def test_json_with_wrong_field_types(tmp_path, capsys):
    d = base("bad_types", differentiable="sometimes", dims="T,n,C")
    d["params"] = [{"name": "iters", "type": "int", "min": "ten"}]
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1
    assert "bad_types: error: dims: " in out
    assert "bad_types: error: differentiable: " in out
    assert "bad_types: error: params.0.min: " in out


def test_missing_torch_backend(tmp_path, capsys):
    d = base("no_torch", backends=[{"name": "cutile", "module": "tilekernels.mhc.ops", "toolchain": ["cutile"]}])
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1 and "no_torch: error:" in out and "every op needs the torch backend" in out


def test_gpu_backend_without_registered_kernels(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(caps.TOOLCHAINS, "cutile", lambda: caps.Toolchain("cutile", True, "test"))
    d = base("no_kernels")
    d["backends"] = [{"name": "cutile", "module": "tilekernels.mhc.ops", "toolchain": ["cutile"],
                      "passes": ["fwd", "bwd"]}, *d["backends"]]
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1
    assert "no_kernels: error: backend cutile: declares pass 'fwd' but tilekernels.mhc.ops registers no fwd" in out
    assert "declares pass 'bwd'" in out


def test_gpu_backend_module_missing_toolchain_is_a_warning(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(caps.TOOLCHAINS, "cute", lambda: caps.Toolchain("cute", False, "not installed (test)"))
    d = base("cute_op")
    d["backends"] = [{"name": "cute", "module": "tilekernels.no_such_cute_mod", "toolchain": ["cute"]},
                     *d["backends"]]
    path = write_json(tmp_path, d)
    rc, out = lint(capsys, path)
    assert rc == 0, out
    assert "cute_op: warning: backend cute: module 'tilekernels.no_such_cute_mod' does not import" in out
    assert "toolchain cute not installed here" in out
    rc, out = lint(capsys, "--strict", path)
    assert rc == 1
    # with the toolchain present the same import failure is an error
    monkeypatch.setitem(caps.TOOLCHAINS, "cute", lambda: caps.Toolchain("cute", True, "test"))
    rc, out = lint(capsys, path)
    assert rc == 1 and "cute_op: error: backend cute: module" in out


def test_torch_backend_module_missing_is_an_error(tmp_path, capsys):
    d = base("torch_missing")
    d["backends"] = [{"name": "torch", "module": "tilekernels.no_such_torch_mod"}]
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1 and "torch_missing: error: backend torch: module 'tilekernels.no_such_torch_mod'" in out


def test_shipped_name_clash_is_a_warning(tmp_path, capsys):
    rc, out = lint(capsys, write_json(tmp_path, base("mhc_h_aggregate")))
    assert rc == 0
    assert "mhc_h_aggregate: warning: shadows the shipped op of the same name (specs/mhc.py)" in out


def test_value_reading_when_is_a_warning(tmp_path, capsys):
    """On a device tensor a value-reading ``when`` and its expression both run as tensor ops: the when does not
    guard it (min() of an empty cu_seqlens raises though the when is false); ``in`` on tensor values is read on
    the host. The shipped specs have neither."""
    d = registry.get("thd_cp_a2a_perm").spec.model_dump(mode="json")
    d["name"] = "value_when"
    d["backends"] = [b for b in d["backends"] if b["name"] == "torch"]
    d["constraints"].append({"expr": "min(values(cu_seqlens)) == 0", "when": "len(values(cu_seqlens)) > 0"})
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 0 and "value_when: warning: constraint 'min(values(cu_seqlens)) == 0': its when" in out, out
    assert lint(capsys, "--strict", write_json(tmp_path, d))[0] == 1
    d["constraints"][-1] = {"expr": "max(values(cu_seqlens)) in (0, 8)"}
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 0 and "'max(values(cu_seqlens)) in (0, 8)' applies is / in to tensor values" in out, out


def test_unused_dim_is_a_warning(tmp_path, capsys):
    d = base("unused_dim")
    d["dims"].append({"name": "Z"})
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 0 and "unused_dim: warning: dim 'Z' appears in no tensor shape" in out


def test_broken_files(tmp_path, capsys):
    bad_py = write_py(tmp_path, "from specs.schema import Dim\nSPECS = [Dim(name='1x')]\n", "bad.py")
    no_specs = write_py(tmp_path, "X = 1\n", "nospecs.py")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    txt = tmp_path / "specs.txt"
    txt.write_text("")
    rc, out = lint(capsys, bad_py, no_specs, str(bad_json), str(txt), str(tmp_path / "missing.json"))
    assert rc == 1
    assert "bad.py: -: error: importing the module failed: name: dim name '1x' is not an identifier" in out
    assert "0 spec(s) from 5 source(s): 5 error(s)" in out
    assert "nospecs.py: -: error: module defines no SPECS list" in out
    assert "bad.json: -: error: not valid JSON" in out
    assert "specs.txt: -: error: unsupported file type '.txt'" in out
    assert "missing.json: -: error: no such file" in out


def test_non_spec_item(tmp_path, capsys):
    rc, out = lint(capsys, write_json(tmp_path, [3]))
    assert rc == 1 and "<spec #0>: error: expected an OpSpec or a dict, got int" in out


def test_cli_subprocess(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(C.REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = lambda *a: subprocess.run([sys.executable, "-m", "tools.spec_lint", *a], cwd=C.REPO_ROOT, env=env,
                                    capture_output=True, text=True, timeout=300)
    p = run(write_json(tmp_path, [base("fine"), base("x", backends=[])]))
    assert p.returncode == 1 and "x: error:" in p.stdout and "fine:" not in p.stdout
    assert "2 spec(s) from 1 source(s): 1 error(s)" in p.stdout


# ------------------------------------------------- what the schema refuses, so the linter does


def test_backend_constraint_when_naming_unknown(tmp_path, capsys):
    """Was only parsed: the unknown name surfaced as an ExprError at call time."""
    d = base("bad_when")
    d["backends"][0]["constraints"] = [{"expr": "T > 0", "when": "foo > 1"}]
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1
    assert "bad_when: error: spec: backend torch constraint 'T > 0' (when) names unknown ['foo']" in out


@pytest.mark.parametrize("param, problem", [
    ({"type": "int", "default": 0, "min": 1}, "param k: default 0 is below min 1"),
    ({"type": "int", "default": 9, "max": 8}, "param k: default 9 is above max 8"),
    ({"type": "int", "default": True}, "param k: default True is not of type int (a bool is not a number)"),
    ({"type": "float", "default": False}, "param k: default False is not of type float (a bool is not a number)"),
    ({"type": "int", "default": 1.5}, "param k: default 1.5 is not of type int"),
    ({"type": "str", "default": 3}, "param k: default 3 is not of type str"),
    ({"type": "bool", "default": 1}, "param k: default 1 is not of type bool"),
    ({"type": "ints", "default": [1, True]}, "param k: default [1, True] is not a list of ints"),
    ({"type": "ints", "default": [1, 50], "max": 10}, "param k: default [1, 50] is above max 10"),
    ({"type": "float", "default": None}, "param k: default None is not of type float (nullable=True allows None)"),
    ({"type": "float", "default": 1.5, "min": 2, "max": 1}, "param k: min 2.0 > max 1.0"),
    ({"type": "int", "default": 1, "min": 2, "max": 1}, "param k: min 2 > max 1"),  # (an int param's bounds: ints)
    ({"type": "float", "default": float("nan")}, "param k: default nan is not finite (set finite=False to allow"),
    ({"type": "float", "default": float("-inf")}, "param k: default -inf is not finite"),
    ({"type": "str", "default": "a", "min": 1}, "param k: min/max apply to int, float and ints params, not str"),
])
def test_param_default_type_range_and_finiteness(tmp_path, capsys, param, problem):
    """Every call that leaves such a param out would be refused (or get NaN): the spec is wrong."""
    d = base("bad_param_default")
    d["params"] = [{"name": "k", **param}]
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1 and f"bad_param_default: error: params.0: {problem}" in out, out


@pytest.mark.parametrize("param", [
    dict(type="float", default=2),  # an int is acceptable for a float
    dict(type="float", default=float("inf"), finite=False),
    dict(type="float", default=None, nullable=True, min=0.0),
    dict(type="int", required=True, min=1),  # a required param's default is never used
    dict(type="ints", default=(1, 2), min=1, max=2),
    dict(type="str", default="a", choices=["a", "b"]),
    dict(type="object", default=None),
])
def test_param_defaults_the_registry_accepts(param):
    from specs.schema import Param

    p = Param(name="k", **param)
    assert p.finite is param.get("finite", True)


def test_param_finite_field_defaults_to_true():
    from specs.schema import Param

    assert Param(name="alpha", type="float", default=1.0).finite is True
    assert Param(name="alpha", type="float", default=float("nan"), finite=False).finite is False
    with pytest.raises(ValidationError, match="param alpha: default nan is not finite"):
        Param(name="alpha", type="float", default=float("nan"))


@pytest.mark.parametrize("dim, problem", [
    ({"multiple_of": 0}, "dims.2: dim C: multiple_of 0 must be >= 1"),
    ({"multiple_of": -4}, "dims.2: dim C: multiple_of -4 must be >= 1"),
    ({"min": -1}, "dims.2: dim C: min -1 is negative"),
    ({"min": 5, "max": 2}, "dims.2: dim C: min 5 > max 2"),
])
def test_dim_range_and_multiple_of(tmp_path, capsys, dim, problem):
    d = base("bad_dim_range")
    d["dims"][2].update(dim)
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1 and f"bad_dim_range: error: {problem}" in out, out


@pytest.mark.parametrize("shape, problem", [
    ([-1, "n", "C"], "tensor x: shape entry -1 is negative"),
    (["T", "n", "C//0"], "tensor x: 'C//0': 'C // 0' divides by zero"),
    (["T", "n", "C % 0"], "tensor x: 'C % 0': 'C % 0' divides by zero"),
    (["T", "n", "1 - 3"], "tensor x: shape entry '1 - 3' evaluates to -2, not a size >= 0"),
])
def test_negative_and_zero_division_shape_entries(tmp_path, capsys, shape, problem):
    d = base("bad_shape")
    d["inputs"][0]["shape"] = shape
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1 and f"bad_shape: error: spec: {problem}" in out, out


def test_unbounded_constant_expressions(tmp_path, capsys):
    """`9 ** 9 ** 9 > 1` passed the linter and then hung every call."""
    d = base("huge_const")
    d["constraints"] = [{"expr": "9 ** 9 ** 9 > 1"}]
    d["backends"][0]["constraints"] = [{"expr": "T * n < 16 ** 60 * 16 ** 60"}]
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1
    assert ("huge_const: error: constraints.0.expr: '9 ** 9 ** 9 > 1': constant sub-expression '9 ** 9 ** 9 > 1' "
            "cannot be evaluated: 9 ** 387420489: an int exponent must be in [0, 64]") in out
    assert ("huge_const: error: backends.0.constraints.0.expr: 'T * n < 16 ** 60 * 16 ** 60': constant "
            "sub-expression '16 ** 60 * 16 ** 60' cannot be evaluated:") in out and "|result| exceeds 2**256" in out


# ------------------------------------------------------------------------- loading modules


@pytest.mark.parametrize("family", ["mhc", "moe", "gdn", "cp"])
def test_shipped_module_paths_lint_clean(capsys, family):
    """`tk-spec-lint specs/mhc.py` failed: the module's `from .schema import ...` had no package."""
    shipped = sys.modules[f"specs.{family}"]
    rc, out = lint(capsys, str(C.REPO_ROOT / "specs" / f"{family}.py"))
    n = len(shipped.SPECS)
    assert rc == 0 and f"{n} spec(s) from 1 source(s): 0 error(s), 0 warning(s) -> ok" in out, out
    assert sys.modules[f"specs.{family}"] is shipped  # the shipped module is put back


def test_user_module_with_relative_imports(tmp_path, capsys):
    path = write_py(tmp_path, "from .schema import OpSpec\nfrom .mhc import SPECS as _S\n"
                              "SPECS = [OpSpec(**{**_S[0].model_dump(), 'name': 'rel_op'})]\n", "rel_specs.py")
    rc, out = lint(capsys, path)
    assert "rel_specs.py: -: error" not in out and "1 spec(s) from 1 source(s)" in out, out
    assert "specs.rel_specs" not in sys.modules


@pytest.mark.parametrize("body, what", [("raise SystemExit(3)\n", "SystemExit: the module exits (status 3)"),
                                        ("import sys\nsys.exit()\n", "SystemExit: the module exits (status None)"),
                                        ("raise GeneratorExit('gone')\n", "GeneratorExit: gone")])
def test_module_that_exits_at_import_is_a_problem(tmp_path, capsys, body, what):
    """SystemExit at import ended the linter silently (exit status of the module, no report)."""
    rc, out = lint(capsys, write_py(tmp_path, body, "exits.py"), write_json(tmp_path, base("after_exit")))
    assert rc == 1
    assert f"exits.py: -: error: importing the module failed: {what}" in out
    assert "1 spec(s) from 2 source(s): 1 error(s)" in out  # the next file was still linted


def _dim(name):
    return {"name": name, "min": 0, "max": None, "multiple_of": 1, "doc": ""}


def _out_in_constraint(d):
    d["constraints"] += [{"expr": "ndim(out) == 2"}]


def _helper_named_dim(d):
    d["dims"] += [_dim("max")]
    d["inputs"][1]["shape"] = ["T", "max"]


def _like_an_output(d):
    d["inputs"][1]["dtypes"] = "like:out"


def _never_bound_dim(d):
    d["dims"] += [_dim("Q")]
    d["inputs"][1]["shape"] = ["T", "2*Q"]


def _bound_in_one_layout_only(d):
    """Q bare in layout "a" only; "b" names it in an expression: there no call binds it."""
    d["dims"] += [_dim("Q")]
    d["params"] = [{"name": "mode", "type": "str", "default": "a", "choices": ["a", "b"]}]
    d["layouts"] = {"a": "mode == 'a'", "b": "mode == 'b'"}
    for t in d["inputs"] + d["outputs"]:
        t["shape"] = {"a": t["shape"], "b": t["shape"]}
    d["inputs"][1]["shape"] = {"a": ["T", "n", "Q"], "b": ["T", "n", "2*Q"]}


def _output_dtype_limit(d):
    d["backends"][0]["dtypes"] = {"out": ["float32"]}


def _resolve_missing(d):
    next(p for p in d["params"] if p["name"] == "cp")["resolve"] = "tilekernels.cp.ops:no_such_function"


def _cp_base(name):
    d = registry.get("thd_cp_to_hp").spec.model_dump(mode="json")
    d["name"] = name
    d["backends"] = [b for b in d["backends"] if b["name"] == "torch"]
    assert next(p for p in d["params"] if p["name"] == "cp")["resolve"] == "tilekernels.cp.ops:resolve_cp"
    return d


@pytest.mark.parametrize("make,mutate,problem", [
    # each passed the linter (exit 0, --strict too) and failed only at call time, or never: an ExprError at every
    # call, not a SpecError (a); int(...) is not callable (b); the input's dtype never checked (c); the shape entry
    # never checked (d, e); the output's dtype limit never checked, so the registry chose a backend that cannot write
    # it (f: mxfp8_dequantize's cute backend with out_dtype float64); an AttributeError at every call (g). Exactly one
    # error each (f's message holds "; ", which once split it in two)
    (base, _out_in_constraint, "constraint 'ndim(out) == 2' names output tensors ['out']"),
    (base, _helper_named_dim, "dim/input/param names ['max'] shadow the expression helpers"),
    (base, _like_an_output, "tensor h_pre: dtypes 'like:out' names no other input tensor"),
    (base, _never_bound_dim, "dims ['Q'] appear in input shape expressions but no input's shape there has them"),
    (base, _bound_in_one_layout_only, "dims ['Q'] appear in input shape expressions in layout 'b' but"),
    (base, _output_dtype_limit, "backend torch: dtypes restrict 'out', which is not an input tensor"),
    (_cp_base, _resolve_missing, "param cp: resolve 'tilekernels.cp.ops:no_such_function' does not import"),
], ids=["output-in-constraint", "helper-name", "like-output", "unbound-dim", "unbound-in-a-layout",
        "output-dtype-limit", "resolve"])
def test_specs_that_fail_only_at_call_time(tmp_path, capsys, make, mutate, problem):
    d = make("late_fail")
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 0, out   # the unmutated spec is clean
    mutate(d)
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 1, out
    assert "late_fail: error:" in out and problem in out and "1 error(s)" in out, out


def test_outputs_may_take_any_name(tmp_path, capsys):
    """Outputs never enter an expression's environment, so one named like a helper (a reduction's ``max``) is fine."""
    d = base("max_out")
    d["outputs"][0]["name"] = "max"
    rc, out = lint(capsys, write_json(tmp_path, d))
    assert rc == 0, out
