"""tk-probe: what this machine is, what it can run, and which backend each op gets.

Reports the host, torch and its CUDA build, every GPU (through torch, and the
driver through cuda-python), the cuTile toolchain (cuda.tile, tileiras and
whether its version matches the nvcc/nvvm it uses, arch support) and CuTe DSL,
then for every registered op which backend ``auto`` picks here and why, using
the op's bench-case inputs (or the spec's backend list when it has none).

    tk-probe            human-readable report
    tk-probe --json     one JSON object on stdout

A machine without a GPU (or without a driver, or without cuda-python) is a
normal answer, not an error: the tool says so and exits 0.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
from typing import Any, Optional

import torch

from . import _common as C

# The GPU generations the project builds cuTile and CuTe DSL kernels for
# (Hopper sm_90, Blackwell sm_100). Backends declaring an `sm` range in their
# spec refine this per op; dispatch itself only looks at the specs.
TOOLCHAIN_TARGETS = {"cutile": (90, 100), "cute": (90, 100)}


# ---------------------------------------------------------------- driver


def _cuda_driver_module():
    try:
        from cuda.bindings import driver  # cuda-python >= 12.6
        return driver, None
    except ImportError:
        pass
    try:
        from cuda import cuda as driver  # older cuda-python
        return driver, None
    except ImportError as e:
        return None, f"cuda-python is not installed ({e})"


def _cu_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _cu_check(driver, res, what: str):
    """Unpack a cuda-python (err, *values) tuple; raise RuntimeError with the error name."""
    err, *vals = res if isinstance(res, tuple) else (res,)
    if int(err) != 0:
        name = str(err)
        try:
            e2, s = driver.cuGetErrorName(err)
            if int(e2) == 0:
                name = s.decode() if isinstance(s, bytes) else str(s)
        except Exception:  # noqa: BLE001
            pass
        raise RuntimeError(f"{what} failed: {name}")
    return vals[0] if len(vals) == 1 else tuple(vals)


def kernel_driver_version() -> Optional[str]:
    """The NVIDIA kernel driver version (e.g. 580.65.06), if readable."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as f:
            m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", f.read())
            if m:
                return m.group(1)
    except OSError:
        pass
    rc, out = C.run_cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=15)
    if rc == 0 and out:
        return out.splitlines()[0].strip()
    return None


def driver_info() -> dict[str, Any]:
    """Driver facts through cuda-python; never raises."""
    info: dict[str, Any] = {"ok": False, "cuda_python": None, "driver_version": None,
                            "cuda_driver_api": None, "device_count": 0, "devices": [], "error": None}
    driver, err = _cuda_driver_module()
    if driver is None:
        info["error"] = err
        return info
    info["cuda_python"] = C.dist_version("cuda-python") or C.dist_version("cuda-bindings")
    info["driver_version"] = kernel_driver_version()
    try:
        _cu_check(driver, driver.cuInit(0), "cuInit")
        info["cuda_driver_api"] = _cu_version(int(_cu_check(driver, driver.cuDriverGetVersion(), "cuDriverGetVersion")))
        n = int(_cu_check(driver, driver.cuDeviceGetCount(), "cuDeviceGetCount"))
        info["device_count"] = n
        attr = driver.CUdevice_attribute
        for i in range(n):
            dev = _cu_check(driver, driver.cuDeviceGet(i), "cuDeviceGet")
            name = _cu_check(driver, driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
            name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
            major = _cu_check(driver, driver.cuDeviceGetAttribute(
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute")
            minor = _cu_check(driver, driver.cuDeviceGetAttribute(
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute")
            mem = _cu_check(driver, driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem")
            info["devices"].append({"index": i, "name": name, "sm": C.sm_name(int(major), int(minor)),
                                    "memory_gib": round(int(mem) / 2**30, 1)})
        info["ok"] = True
    except Exception as e:  # noqa: BLE001 - no driver library, no device, ...
        info["error"] = f"no usable NVIDIA driver/GPU ({type(e).__name__}: {str(e).strip()})"
    return info


# ------------------------------------------------------------- toolchains


def _tool_version(path: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """(version like 13.5.37, raw error) from `<path> --version`."""
    if not path:
        return None, None
    rc, out = C.run_cmd([path, "--version"], timeout=30)
    if rc != 0:
        return None, out or f"exit {rc}"
    m = re.search(r"\bV(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    return (m.group(1) if m else None), (None if m else f"unrecognised output: {out[:120]!r}")


def _same_release(a: str, b: str) -> bool:
    n = min(len(a.split(".")), len(b.split(".")), 3)
    return a.split(".")[:n] == b.split(".")[:n]


def _arch_support(toolchain: str, sms: list[int]) -> dict[str, Any]:
    from specs import all_specs

    declared = sorted({b.sm for s in all_specs() for b in s.backends
                       if toolchain in b.toolchain and b.sm is not None})
    lo, hi = TOOLCHAIN_TARGETS[toolchain]
    ranges = declared or [(lo, hi)]
    out = {"targets": f"sm_{lo}..sm_{hi}",
           "spec_ranges": [f"sm_{a}..sm_{b}" for a, b in declared],
           "devices": {}}
    for sm in sms:
        out["devices"][f"sm_{sm}"] = any(a <= sm <= b for a, b in ranges)
    return out


def cutile_info(sms: list[int]) -> dict[str, Any]:
    from registry import capabilities as caps

    t = caps.cutile()
    d = dict(t.details)
    tileiras = d.get("tileiras")
    info: dict[str, Any] = {
        "ok": t.ok, "reason": t.reason, "importable": not t.reason.startswith("cannot import"),
        "version": t.version, "tileiras": tileiras,
        "wheels": {k: v for k, v in d.items() if k.startswith("nvidia-")},
    }
    ver, err = _tool_version(tileiras)
    info["tileiras_version"] = ver
    if err:
        info["tileiras_error"] = err
    # What tileiras is checked against: the nvcc/nvvm wheels, or the ptxas beside it (bundles).
    against = {k: v for k, v in info["wheels"].items()
               if k in ("nvidia-cuda-nvcc", "nvidia-nvvm") and v}
    if not against and tileiras:
        ptxas = os.path.join(os.path.dirname(tileiras), "ptxas")
        if os.path.exists(ptxas):
            pv, _ = _tool_version(ptxas)
            if pv:
                against["ptxas (beside tileiras)"] = pv
    info["checked_against"] = against
    info["versions_match"] = (None if not ver or not against
                              else all(_same_release(ver, v) for v in against.values()))
    info["arch"] = _arch_support("cutile", sms)
    return info


def cute_info(sms: list[int]) -> dict[str, Any]:
    from registry import capabilities as caps

    t = caps.cute()
    return {"ok": t.ok, "reason": t.reason, "importable": t.ok, "version": t.version,
            "arch": _arch_support("cute", sms)}


# -------------------------------------------------------------------- ops


def _choice(explained: list[tuple[str, bool, str]]) -> dict[str, Any]:
    chosen = next(((n, why) for n, ok, why in explained if ok), (None, "no backend usable"))
    rejected = [f"{n}: {why}" for n, ok, why in explained if not ok]
    return {"backend": chosen[0], "reason": chosen[1], "rejected": rejected,
            "backends": [{"name": n, "ok": ok, "reason": why} for n, ok, why in explained]}


def _static_backends(spec, device: torch.device, sm: Optional[int]) -> list[tuple[str, bool, str]]:
    """Backend usability without inputs (op has no bench case): device, SM, toolchain, kernels."""
    from registry.core import machine_reasons, torch_reason
    from tilekernels._glue import has_kernel

    out = []
    for b in spec.backends:
        if b.name == "torch":
            out.append((b.name, True, torch_reason(b)))
            continue
        why, _ = machine_reasons(b, device, sm)
        if not why:
            try:
                importlib.import_module(b.module)
                missing = [p for p in b.passes if not has_kernel(spec.name, b.name, p)]
                if missing:
                    why.append(f"{b.module} registers no {'/'.join(missing)} kernel")
            except Exception as e:  # noqa: BLE001
                why.append(f"cannot import {b.module} ({type(e).__name__}: {e})")
        out.append((b.name, not why, "; ".join(why) or
                    f"{b.name}: device, SM and toolchain fit (shape/dtype limits not checked: no bench case)"))
    return out


def _group_exists() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def ops_info(device: torch.device) -> tuple[list[dict[str, Any]], list[str]]:
    """Per registered op (and bench variant): auto's backend for fwd and fwd+bwd, with reasons."""
    import registry

    notes = []
    by_op: dict[str, list] = {}
    for fc in C.family_cases(device.type):
        if fc.error:
            notes.append(f"family {fc.family}: {fc.error}")
        elif fc.missing:
            notes.append(f"family {fc.family}: no tilekernels.{fc.family}.bench module yet")
        for case in fc.cases:
            by_op.setdefault(case.op, []).append(case)
    sm = None
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        sm = major * 10 + minor
    out = []
    for name in registry.names():
        op = registry.get(name)
        spec = op.spec
        base = {"op": name, "family": spec.family, "differentiable": spec.differentiable}
        cases = by_op.get(name, [])
        collective = any("distributed" in b.requires for b in spec.backends)
        for case in cases:
            rec = dict(base, variant=case.variant, source="bench case", dims=dict(case.dims), dtype=case.dtype)
            # a collective's bench case makes a world-size-1 process group when there is none: say so, and end it
            # after (a probe reports this process as it is, and leaves no group behind in an in-process caller)
            made_group = collective and not _group_exists()
            try:
                args, params = case.make(dict(case.dims), device)
                if made_group:
                    rec["note"] = ("explained on a world-size-1 process group made for the check: this process "
                                   "has none, and without one no backend of this op is usable")
                rec["fwd"] = _choice(op.explain(*args, **params))
                if spec.differentiable and case.grad_inputs:
                    def leaf(n, t):
                        return t.detach().requires_grad_(True) if n in case.grad_inputs else t
                    gargs, gparams = C.with_inputs(spec, args, params, leaf)
                    with torch.enable_grad():
                        rec["fwd+bwd"] = _choice(op.explain(*gargs, **gparams))
                    del gargs, gparams
                del args, params
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"{type(e).__name__}: {e}"
                rec["source"] = "static (bench case failed)"
                rec["fwd"] = _choice(_static_backends(spec, device, sm))
            finally:
                # a gloo group ends here; an NCCL one (a GPU) is left to the bench case's exit hook, as in tk-bench
                # (NCCL's destroy in mid-process is not tried on the device: tests/conftest.py)
                if made_group and _group_exists() and device.type != "cuda":
                    import torch.distributed as dist

                    dist.destroy_process_group()
            out.append(rec)
        if not cases:
            rec = dict(base, variant="", source="static (no bench case)", dims={}, dtype=None)
            rec["fwd"] = _choice(_static_backends(spec, device, sm))
            out.append(rec)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out, notes


# ---------------------------------------------------------------- report


def gather() -> dict[str, Any]:
    device = C.default_device()
    tinfo = C.torch_info()
    gpus = [C.gpu_info(i) for i in range(tinfo["device_count"])]
    sms = sorted({int(g["sm"][3:]) for g in gpus})
    ops, notes = ops_info(device)
    return {
        "tool": "tk-probe",
        "date": C.now_iso(),
        "git_commit": C.git_commit(),
        "host": C.host_info(),
        "torch": tinfo,
        "gpus": gpus,
        "driver": driver_info(),
        "cutile": cutile_info(sms),
        "cute": cute_info(sms),
        "default_device": str(device),
        "ops": ops,
        "notes": notes,
    }


def _yn(v) -> str:
    return {True: "yes", False: "NO", None: "unknown"}[v]


def render(r: dict[str, Any]) -> str:
    h, t, d = r["host"], r["torch"], r["driver"]
    lines = [
        "== host",
        f"  {h['hostname']}: {h['os']}, {h['python']}, {h['cpu_count']} CPUs ({h['cpu_model']})",
        "== torch",
        f"  torch {t['version']}, CUDA build {t['cuda_build'] or 'none (CPU-only build)'}, "
        f"CUDA available: {_yn(t['cuda_available'])}",
        "== GPUs (torch)",
    ]
    if r["gpus"]:
        lines += [f"  [{g['index']}] {g['name']}  {g['sm']}  {g['memory_gib']} GiB  {g['multiprocessors']} SMs"
                  for g in r["gpus"]]
    else:
        lines.append("  none: torch sees no CUDA device; every op runs its torch backend on the CPU")
    lines.append("== driver (cuda-python)")
    if d["ok"]:
        lines.append(f"  driver {d['driver_version'] or 'unknown'}, CUDA driver API {d['cuda_driver_api']}, "
                     f"{d['device_count']} device(s), cuda-python {d['cuda_python']}")
        lines += [f"  [{g['index']}] {g['name']}  {g['sm']}  {g['memory_gib']} GiB" for g in d["devices"]]
    else:
        lines.append(f"  unavailable: {d['error']}")
    cu = r["cutile"]
    lines += ["== cuTile",
              f"  importable: {_yn(cu['importable'])}, version {cu['version'] or '-'}; "
              f"usable: {_yn(cu['ok'])} ({cu['reason']})",
              f"  tileiras: {cu['tileiras'] or 'not found'}"
              + (f", version {cu['tileiras_version']}" if cu["tileiras_version"] else "")
              + (f" ({cu['tileiras_error']})" if cu.get("tileiras_error") else "")]
    if cu["checked_against"]:
        against = ", ".join(f"{k} {v}" for k, v in cu["checked_against"].items())
        lines.append(f"  matches {against}: {_yn(cu['versions_match'])}")
    for key, label in (("cutile", None), ("cute", "CuTe DSL")):
        x = r[key]
        if label:
            lines += [f"== {label}",
                      f"  importable: {_yn(x['importable'])}, version {x['version'] or '-'} ({x['reason']})"]
        a = x["arch"]
        sup = ", ".join(f"{k}: {_yn(v)}" for k, v in a["devices"].items()) or "no GPU here"
        lines.append(f"  arch: targets {a['targets']}"
                     + (f" (specs declare {', '.join(a['spec_ranges'])})" if a["spec_ranges"] else "")
                     + f"; this machine: {sup}")
    lines.append(f"== ops: backend `auto` picks on {r['default_device']}")
    for o in r["ops"]:
        tag = o["op"] + (f" [{o['variant']}]" if o["variant"] else "")
        shape = C.fmt_dims(o["dims"]) if o["dims"] else o["source"]
        lines.append(f"  {tag}  ({shape})")
        if o.get("error"):
            lines.append(f"      bench case failed: {o['error']}")
        if o.get("note"):
            lines.append(f"      note: {o['note']}")
        for pass_ in ("fwd", "fwd+bwd"):
            if pass_ in o:
                c = o[pass_]
                lines.append(f"    {pass_:8s} -> {c['backend']}: {c['reason']}")
                lines += [f"{'':16s}not {x}" for x in c["rejected"]]
    lines += [f"  note: {n}" for n in r["notes"]]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="tk-probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)
    C.setup_logging()
    report = gather()
    if args.json:
        C.write_json(report, None)
    else:
        print(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
