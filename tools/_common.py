"""Pieces shared by the tk-* command-line tools (probe, spec-lint, bench).

Host and device description, git commit lookup, bench-case discovery, text
tables, number formatting and JSON output live here so that the three tools
never repeat each other.
"""
from __future__ import annotations

import datetime as _dt
import importlib
import json
import logging
import math
import os
import platform
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ facts


def git_commit(cwd: Optional[Path] = None) -> str:
    """$TILEKERNELS_COMMIT if set (where the code travels without its own .git, e.g. a
    GPU host, whose copy may hold a stale one); else ``git rev-parse HEAD`` of the
    checkout holding this code, with "-dirty" appended when tracked files differ from it;
    else "unknown"."""
    env = os.environ.get("TILEKERNELS_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=str(cwd or REPO_ROOT),
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return env or "unknown"
    sha = out.stdout.strip()
    if out.returncode != 0 or not sha:
        return "unknown"
    try:  # a tree that differs from HEAD (edits, or a GPU host's copy beside a stale .git) says so
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=str(cwd or REPO_ROOT),
                            capture_output=True, text=True, timeout=10)
        dirty = st.returncode == 0 and bool(st.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        dirty = False
    return sha + "-dirty" if dirty else sha


def short_commit(commit: str) -> str:
    """The first 12 hex digits of ``git_commit()``'s value, its "-dirty" mark kept."""
    sha, dirty, _ = commit.partition("-dirty")
    return sha[:12] + ("-dirty" if dirty else "")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def dist_version(name: str) -> Optional[str]:
    """Installed version of a distribution, None if absent."""
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "python_executable": sys.executable,
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
    }


def torch_info() -> dict[str, Any]:
    cuda_ok = torch.cuda.is_available()
    return {
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,  # None for a CPU-only build
        "cuda_available": cuda_ok,
        "device_count": torch.cuda.device_count() if cuda_ok else 0,
    }


def sm_name(major: int, minor: int) -> str:
    return f"sm_{major}{minor}"


def default_device() -> torch.device:
    """The device tk-bench and tk-probe build inputs on: cuda:0 if usable, else cpu."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def gpu_info(index: int) -> dict[str, Any]:
    p = torch.cuda.get_device_properties(index)
    return {
        "index": index,
        "name": p.name,
        "sm": sm_name(p.major, p.minor),
        "memory_gib": round(p.total_memory / 2**30, 1),
        "multiprocessors": p.multi_processor_count,
    }


def device_info(device: torch.device) -> dict[str, Any]:
    """What a result was measured on: {"type", "name", and for GPUs "sm", "memory_gib"; for
    the CPU its torch threads, CPU count and 1-minute load average}."""
    if device.type == "cuda":
        info = gpu_info(device.index if device.index is not None else torch.cuda.current_device())
        info["type"] = "cuda"
        return info
    info = {"type": device.type, "name": f"{device.type} ({cpu_model()})", "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count()}
    try:  # what else the host ran at the start (busy cores stall torch's intra-op threads)
        info["load_avg_1min"] = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        pass
    return info


def device_label(device: torch.device) -> str:
    """Short device name for records: the GPU's name, or "cpu"."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


# ------------------------------------------------------------ bench cases


@dataclass
class FamilyCases:
    """One family's ``tilekernels.<family>.bench.cases(device_type)`` result."""
    family: str
    cases: list = field(default_factory=list)
    missing: bool = False          # the family has no bench module (yet)
    error: Optional[str] = None    # importing it or calling cases() failed


def family_cases(device_type: str, families: Optional[Iterable[str]] = None) -> list[FamilyCases]:
    """Every family's bench cases for ``device_type``; a failure is recorded, not raised."""
    from specs import FAMILIES

    out = []
    for fam in families or FAMILIES:
        modname = f"tilekernels.{fam}.bench"
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name in (modname, f"tilekernels.{fam}"):
                out.append(FamilyCases(fam, missing=True))
            else:
                out.append(FamilyCases(fam, error=f"import {modname}: {type(e).__name__}: {e}"))
            continue
        except Exception as e:  # noqa: BLE001 - report any failure, keep going
            out.append(FamilyCases(fam, error=f"import {modname}: {type(e).__name__}: {e}"))
            continue
        try:
            cases = list(mod.cases(device_type))
        except Exception as e:  # noqa: BLE001
            out.append(FamilyCases(fam, error=f"{modname}.cases({device_type!r}): {type(e).__name__}: {e}"))
            continue
        out.append(FamilyCases(fam, cases=cases))
    return out


def import_attr(path: str) -> Any:
    """``"package.module:attr"`` -> the attribute (ImportError/AttributeError propagate)."""
    mod, _, attr = path.partition(":")
    obj = importlib.import_module(mod)
    return getattr(obj, attr) if attr else obj


def input_tensor(spec, args: Sequence, params: dict, name: str):
    """The tensor a call passes for spec input ``name`` (positional or keyword), or None."""
    names = [t.name for t in spec.inputs]
    i = names.index(name)
    if i < len(args):
        return args[i]
    return params.get(name)


def with_inputs(spec, args: Sequence, params: dict, fn: Callable[[str, Any], Any]):
    """Rebuild (args, params) with ``fn(name, tensor)`` applied to each spec input."""
    names = [t.name for t in spec.inputs]
    new_args = tuple(fn(names[i], a) if i < len(names) else a for i, a in enumerate(args))
    new_params = {k: (fn(k, v) if k in names else v) for k, v in params.items()}
    return new_args, new_params


# ------------------------------------------------------------- formatting


def fmt_dims(dims: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in dims.items())


def fmt_num(x: Optional[float], digits: int = 3) -> str:
    """Compact number: '-' for None, 'inf'/'nan' as such, else `digits` significant."""
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    mag = abs(x)
    if mag >= 10 ** digits or mag < 1e-3:
        return f"{x:.{max(digits - 1, 1)}e}"
    return f"{x:.{digits}g}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned text table; numbers right-aligned, text left-aligned."""
    cells = [[("-" if c is None else str(c)) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    numeric = [all(_looks_numeric(r[i]) for r in cells) and bool(cells) for i in range(len(headers))]

    def line(vals):
        return "  ".join((v.rjust(w) if num else v.ljust(w))
                         for v, w, num in zip(vals, widths, numeric)).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _looks_numeric(s: str) -> bool:
    if s in ("-", "inf", "nan"):
        return True
    try:
        float(s.rstrip("x%"))
        return True
    except ValueError:
        return False


# ------------------------------------------------------------------ JSON


def jsonable(obj: Any) -> Any:
    """Plain JSON values: non-finite floats -> None, tuples -> lists, paths/dtypes -> str."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


def dumps(obj: Any) -> str:
    return json.dumps(jsonable(obj), indent=2, allow_nan=False)


def unwritable(path: str) -> Optional[str]:
    """Why a file cannot be written at ``path`` (None: it can), checked before a run so that a bad path costs
    an argument error up front, not the run's results: a directory, a parent that is a file, or the nearest
    existing folder above it not writable. A missing parent folder is fine (``write_json`` and tk-bench's plot make
    it)."""
    p = Path(path)
    if p.is_dir():
        return f"{path} is a directory"
    if p.is_symlink() and not p.exists():
        return f"{path} is a symlink to a missing file"
    if p.exists():  # overwriting a file needs only the file's own permission
        return None if os.access(p, os.W_OK) else f"{path} is not writable"
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create files under {parent}"
    return None


def write_json(obj: Any, path: Optional[str]) -> None:
    """Write ``obj`` as JSON to ``path`` ("-" or None: stdout)."""
    text = dumps(obj) + "\n"
    if path in (None, "-"):
        sys.stdout.write(text)
        return
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")


# --------------------------------------------------------------- logging


def setup_logging(verbose: bool = False) -> logging.Logger:
    """Log lines go to stderr (tables and JSON to stdout)."""
    root = logging.getLogger()
    if not root.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(h)
    level = logging.DEBUG if verbose else logging.INFO
    logging.getLogger("tools").setLevel(level)
    return logging.getLogger("tools")


def run_cmd(argv: Sequence[str], timeout: float = 20.0) -> tuple[Optional[int], str]:
    """(exit code or None if it could not run/timed out, stdout+stderr)."""
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    except OSError as e:
        return None, f"{type(e).__name__}: {e}"
    return p.returncode, (p.stdout + p.stderr).strip()
