"""The repository's layout rules, checked on every tracked Python file so that CI catches a drift: no file over
800 lines (the style guide's ~800: a kernel family grows a new module, not a longer one), and the library packages
(tilekernels/, registry/, specs/, tools/) within 120 columns, the width their code and docstrings are written to."""
from __future__ import annotations

import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_LINES = 800
MAX_COLS = 120
LIBRARY = ("tilekernels/", "registry/", "specs/", "tools/")
# lines a tool rewrites whole (benchmarks/probes/gdn_pre_fwd_choose.py matches this one line by a regex)
TOOL_LINES = ("FWD_HB, FWD_HBZ, FWD_EL, FWD_OCC, FWD_NW, FWD_CB, FWD_ZC, FWD_MA, FWD_OCCH, FWD_SX = ",)


def _python_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked-file list is unknown")
    files = [f for f in out.stdout.split("\0") if f and (ROOT / f).is_file()]  # a deleted, unstaged file: not here
    assert files, "git ls-files listed no Python file"
    return files


def _lines(f: str) -> list[str]:
    # split on newlines only (str.splitlines also splits on form feeds and other separators); no empty last line
    lines = (ROOT / f).read_text(encoding="utf-8").split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def test_no_file_over_800_lines():
    long = {f: n for f in _python_files() if (n := len(_lines(f))) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split the module): {long}"


def test_library_lines_within_120_columns():
    wide = []
    for f in _python_files():
        if not f.startswith(LIBRARY):
            continue
        for i, line in enumerate(_lines(f), 1):
            if len(line) > MAX_COLS and not line.startswith(TOOL_LINES):
                wide.append(f"{f}:{i} ({len(line)} columns)")
    assert not wide, f"library lines over {MAX_COLS} columns: {wide}"
