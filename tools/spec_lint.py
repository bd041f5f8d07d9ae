"""tk-spec-lint: check op specs, the shipped ones or your own files.

    tk-spec-lint                       every shipped spec (specs/<family>.py)
    tk-spec-lint my_specs.py a.json    a Python module exposing SPECS (OpSpec objects
                                       or dicts), or a JSON file (one spec object or a list)

A ``.py`` file runs as ``specs.<stem>``, so its relative imports (``from .schema
import ...``) resolve as in the shipped modules; one that raises anything at
import (``SystemExit`` included) is reported, and the other files still linted.

Checks, per spec: the pydantic schema (``OpSpec.model_validate``, which runs
``specs.schema.consistency_problems``: referenced dims/params/tensors exist, in
backend constraints' ``when`` too; constraints, layouts, ``like:`` dtypes and backend
dtype limits name inputs, not outputs; no name shadows an expression helper; every dim
an input's shape expression names is some input's entry of its own (else never bound,
so never checked); expressions parse and stay in the language's
bounds; param defaults have their param's type, range and finiteness; dims have
0 <= min <= max and multiple_of >= 1; no negative or divide-by-zero shape entry;
a torch backend exists, ...); op names unique across
everything checked; every expression parses in ``specs.expr``; declared dims
are used; ``reference`` and ``entry`` import, are callable and accept the op's
inputs (entry also ``backend=``); every param's ``resolve`` imports and is callable;
every backend module imports, and every non-torch backend registers a kernel (``tilekernels._glue``) for each pass it
declares.

Severity: problems are errors (exit 1). Warnings (exit 0 unless ``--strict``):
a GPU backend whose module cannot be imported because its toolchain is not
installed here; a user file's op that reuses a shipped op's name (the file
may be proposing a replacement; two specs with one name in the shipped set is
an error; linting a shipped module by its path is no reuse); a dim no tensor shape names; a reference whose signature
does not take the inputs; a constraint whose ``when`` reads tensor values (on a device
tensor it does not guard its expression: both run as tensor ops), or that
applies ``is`` / ``in`` to tensor values. Every message reads ``<file>: <op>: error: <what>`` (or ``warning:``).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError

from . import _common as C


@dataclass
class Problem:
    source: str
    op: str
    what: str
    severity: str = "error"

    def __str__(self) -> str:
        return f"{self.source}: {self.op}: {self.severity}: {self.what}"


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    checked: int = 0
    sources: int = 0

    def add(self, source, op, what, severity="error"):
        self.problems.append(Problem(str(source), op, what, severity))

    def count(self, severity: str) -> int:
        return sum(p.severity == severity for p in self.problems)


# ---------------------------------------------------------------- loading


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(C.REPO_ROOT))
    except ValueError:
        return str(path)


def _item_name(item: Any, i: int) -> str:
    name = item.get("name") if isinstance(item, dict) else getattr(item, "name", None)
    return name if isinstance(name, str) and name else f"<spec #{i}>"


def _import_spec_module(path: Path):
    """Run a spec module as ``specs.<stem>``, so that its relative imports (``from .schema
    import ...``) resolve like the shipped modules' do. The name is borrowed only while the
    module runs: a shipped module of that name is put back after."""
    import specs  # noqa: F401 - the parent package must be imported for relative imports

    name = f"specs.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "specs"
    shipped = sys.modules.get(name)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        if shipped is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = shipped
    return mod


def _load_items(path: Path, rep: Report) -> Optional[list]:
    """Raw spec items (OpSpec or dict) from a .py or .json file, or None after reporting why."""
    src = _rel(path)
    if not path.exists():
        rep.add(src, "-", "no such file")
        return None
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            rep.add(src, "-", f"not valid JSON: {e}")
            return None
        items = data if isinstance(data, list) else [data]
    elif path.suffix == ".py":
        try:
            mod = _import_spec_module(path)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - a broken OpSpec(...) raises at import, a script may exit
            rep.add(src, "-", f"importing the module failed: {_exc(e)}")
            return None
        if not hasattr(mod, "SPECS"):
            rep.add(src, "-", "module defines no SPECS list")
            return None
        items = mod.SPECS
        if not isinstance(items, (list, tuple)):
            rep.add(src, "-", f"SPECS must be a list, got {type(items).__name__}")
            return None
        items = list(items)
    else:
        rep.add(src, "-", f"unsupported file type {path.suffix!r} (want .py or .json)")
        return None
    return items


def _exc(e: BaseException) -> str:
    if isinstance(e, ValidationError):
        return "; ".join(_validation_lines(e))
    if isinstance(e, SystemExit):
        return f"SystemExit: the module exits (status {e.code!r})"
    return f"{type(e).__name__}: {e}"


def _validation_lines(e: ValidationError) -> list[str]:
    from specs.schema import PROBLEM_SEP

    out = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err.get("loc", ())) or "spec"
        msg = err.get("msg", "").removeprefix("Value error, ")
        if err.get("type") == "value_error" and not isinstance(err.get("input"), str) and PROBLEM_SEP in msg:
            out += [f"{loc}: {m}" for m in msg.split(PROBLEM_SEP)]  # a model's problems, one per line
        else:
            got = err.get("input")
            got = "" if isinstance(got, (dict, list)) or got is None or repr(got) in msg else f" (got {got!r})"
            out.append(f"{loc}: {msg}{got}")
    return out


def _validate(item: Any, src: str, i: int, rep: Report):
    from specs.schema import OpSpec

    name = _item_name(item, i)
    try:
        if isinstance(item, OpSpec):
            return OpSpec.model_validate(item.model_dump())
        if isinstance(item, dict):
            return OpSpec.model_validate(item)
        rep.add(src, name, f"expected an OpSpec or a dict, got {type(item).__name__}")
    except ValidationError as e:
        for line in _validation_lines(e):
            rep.add(src, name, line)
    return None


# ----------------------------------------------------------------- checks


def _check_exprs(spec, src: str, rep: Report) -> None:
    from specs import expr

    exprs = [(f"constraint {c.expr!r}", c.expr) for c in spec.constraints]
    exprs += [(f"constraint {c.expr!r} (when)", c.when) for c in spec.constraints if c.when]
    exprs += [(f"layout {k!r}", v) for k, v in spec.layouts.items()]
    for b in spec.backends:
        exprs += [(f"backend {b.name} constraint {c.expr!r}", c.expr) for c in b.constraints]
        exprs += [(f"backend {b.name} constraint {c.expr!r} (when)", c.when) for c in b.constraints if c.when]
    for t in spec.inputs + spec.outputs:
        for shape in t.all_shapes():
            exprs += [(f"tensor {t.name} shape entry {d!r}", d) for d in shape if isinstance(d, str)]
    for what, e in exprs:
        try:
            expr.parse(e)
        except expr.ExprError as err:
            rep.add(src, spec.name, f"{what} does not parse: {err}")
    named = set()
    for t in spec.inputs + spec.outputs:
        for shape in t.all_shapes():
            for d in shape:
                if isinstance(d, str):
                    try:
                        named |= expr.names(d)
                    except expr.ExprError:
                        pass
    params = {p.name for p in spec.params}
    for d in spec.dims:
        if d.name not in named and d.name not in params:
            rep.add(src, spec.name, f"dim {d.name!r} appears in no tensor shape (it can never be bound)",
                    "warning")


def _check_device_forms(spec, src: str, rep: Report) -> None:
    """Rules whose device form (value rules on a CUDA tensor: tensor ops, ``registry.exprs._Device``) cannot mean
    what their host form does: a value-reading ``when`` (no short-circuit) and ``is`` / ``in`` on tensor values."""
    from specs import expr
    from registry.exprs import reads_values

    tensors = {t.name for t in spec.inputs}
    for c in spec.constraints:
        try:
            if c.when and reads_values(c.when, tensors):
                rep.add(src, spec.name, f"constraint {c.expr!r}: its when {c.when!r} reads tensor values, and for a "
                        "device tensor both run as tensor ops (no short-circuit): the expression must stay "
                        "computable where when is false (no min / max of an empty tensor)", "warning")
            for e in (c.expr, c.when or "True"):
                for node in ast.walk(expr.parse(e).body):
                    if isinstance(node, ast.Compare) and any(
                            isinstance(o, (ast.In, ast.NotIn, ast.Is, ast.IsNot)) for o in node.ops) and any(
                            reads_values(ast.unparse(x), tensors) for x in [node.left, *node.comparators]):
                        rep.add(src, spec.name, f"constraint {c.expr!r}: {ast.unparse(node)!r} applies is / in to "
                                "tensor values, which on a device tensor read them on the host (a sync) and "
                                "skip the device form's int range handling", "warning")
        except expr.ExprError:
            pass  # _check_exprs reports it


def _import_callable(path: str):
    fn = C.import_attr(path)
    if not callable(fn):
        raise TypeError(f"{path} is a {type(fn).__name__}, not callable")
    return fn


def _signature_problem(fn, spec, with_backend: bool) -> Optional[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # builtins / C functions: nothing to check
    args = [object()] * len(spec.inputs)
    kwargs = {p.name: p.default for p in spec.params}
    if with_backend:
        kwargs["backend"] = "torch"
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        call = ", ".join([t.name for t in spec.inputs] + [f"{k}=..." for k in kwargs])
        return f"signature {sig} cannot be called as ({call}): {e}"
    return None


def _check_imports(spec, src: str, rep: Report) -> None:
    from registry import capabilities as caps
    from tilekernels._glue import has_kernel

    for what, path, with_backend, sev in (("reference", spec.reference, False, "warning"),
                                          ("entry", spec.entry, True, "error")):
        try:
            fn = _import_callable(path)
        except Exception as e:  # noqa: BLE001
            rep.add(src, spec.name, f"{what} {path!r} does not import: {type(e).__name__}: {e}")
            continue
        bad = _signature_problem(fn, spec, with_backend)
        if bad:
            rep.add(src, spec.name, f"{what} {path!r}: {bad}", sev)
    for prm in spec.params:
        if prm.resolve is not None:
            try:
                _import_callable(prm.resolve)
            except Exception as e:  # noqa: BLE001
                rep.add(src, spec.name, f"param {prm.name}: resolve {prm.resolve!r} does not import: "
                                        f"{type(e).__name__}: {e}")
    for b in spec.backends:
        try:
            importlib.import_module(b.module)
        except Exception as e:  # noqa: BLE001
            missing_tc = [tc for tc in b.toolchain if not caps.toolchain(tc).ok]
            msg = f"backend {b.name}: module {b.module!r} does not import: {type(e).__name__}: {e}"
            if b.name != "torch" and missing_tc:
                rep.add(src, spec.name, msg + f" (toolchain {', '.join(missing_tc)} not installed here)",
                        "warning")
            else:
                rep.add(src, spec.name, msg)
            continue
        if b.name == "torch":
            continue
        for p in b.passes:
            try:
                ok = has_kernel(spec.name, b.name, p)
            except Exception:  # noqa: BLE001 - an op the registry does not know (user files)
                ok = False
            if not ok:
                rep.add(src, spec.name, f"backend {b.name}: declares pass {p!r} but {b.module} registers "
                                        f"no {p} kernel (tilekernels._glue.kernel({spec.name!r}, {b.name!r}, {p!r}))")


def lint(paths: list[str]) -> Report:
    from specs import FAMILIES

    rep = Report()
    shipped_names: dict[str, str] = {}
    batches: list[tuple[str, list]] = []
    if not paths:
        for fam in FAMILIES:
            src = f"specs/{fam}.py"
            rep.sources += 1
            try:
                items = list(importlib.import_module(f"specs.{fam}").SPECS)
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # noqa: BLE001 - SystemExit too: report it, do not end silently
                rep.add(src, "-", f"importing the module failed: {_exc(e)}")
                continue
            batches.append((src, items))
    else:
        from specs import all_specs

        try:
            shipped_names = {s.name: f"specs/{s.family}.py" for s in all_specs()}
        except Exception:  # noqa: BLE001 - a broken shipped spec: lint it with no args
            shipped_names = {}
        for p in paths:
            rep.sources += 1
            items = _load_items(Path(p), rep)
            if items is not None:
                batches.append((_rel(Path(p)), items))
    seen: dict[str, str] = {}
    for src, items in batches:
        for i, item in enumerate(items):
            rep.checked += 1
            spec = _validate(item, src, i, rep)
            name = spec.name if spec is not None else _item_name(item, i)
            if not name.startswith("<"):
                if name in seen:
                    rep.add(src, name, f"duplicate op name (also defined in {seen[name]})")
                else:
                    seen[name] = src
                if name in shipped_names and shipped_names[name] != src:  # not the shipped file itself
                    rep.add(src, name, f"shadows the shipped op of the same name ({shipped_names[name]})",
                            "warning")
            if spec is None:
                continue
            _check_exprs(spec, src, rep)
            _check_device_forms(spec, src, rep)
            _check_imports(spec, src, rep)
    return rep


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="tk-spec-lint", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="spec modules (.py exposing SPECS) or JSON files; "
                                             "none: the shipped specs")
    ap.add_argument("--strict", action="store_true", help="warnings fail too")
    ap.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    args = ap.parse_args(argv)
    rep = lint(args.paths)
    for p in rep.problems:
        if p.severity == "error" or not args.quiet:
            print(p)
    errors, warnings = rep.count("error"), rep.count("warning")
    failed = errors > 0 or (args.strict and warnings > 0)
    print(f"tk-spec-lint: {rep.checked} spec(s) from {rep.sources} source(s): "
          f"{errors} error(s), {warnings} warning(s) -> {'FAIL' if failed else 'ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
