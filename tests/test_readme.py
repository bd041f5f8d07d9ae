"""The README's Python example runs as printed (on this machine's device: on a CPU, auto picks the torch
reference), and CI runs the README's test command: a README that drifts from the API fails here, not in a user's
first minute."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def test_python_examples_run_verbatim():
    blocks = _blocks("python")
    assert blocks, "README has no python example"
    for i, code in enumerate(blocks):
        # a fresh interpreter: the example's imports and names stand alone (~4 s on a CPU: a [4096, 4, 7168] bf16 x)
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
        assert p.returncode == 0, f"README python block {i} failed:\n{code}\n{p.stderr[-3000:]}"


def test_ci_runs_the_readme_test_command():
    cmds = [line for b in _blocks("bash") for line in b.splitlines() if "pytest" in line]
    assert len(cmds) == 1, cmds
    tail = cmds[0].split("&&")[-1].strip()  # the install steps before it are .ci/run's pip lines
    assert tail.startswith("python -m pytest"), tail
    ci = (ROOT / ".ci" / "run").read_text()
    assert tail.replace("python ", "python3 ", 1) in ci.splitlines(), f"{tail!r} not a line of .ci/run"


def test_tk_bench_flags_as_documented():
    """Each `--flag` the README's tk-bench row names exists, and one that takes a value is shown with one (the row
    listed `--json` alone; `tk-bench --json` exits 2: "expected one argument")."""
    from tools.bench import _argparser

    row = next(line for line in README.splitlines() if line.startswith("| `tk-bench"))
    shown = re.findall(r"`(--[\w-]+)( [^`]+)?`", row)
    assert len(shown) >= 5, shown
    actions = {s: a for a in _argparser()._actions for s in a.option_strings}
    for flag, arg in shown:
        assert flag in actions, f"README names {flag}, which tk-bench does not take"
        takes_value = actions[flag].nargs != 0
        assert takes_value == bool(arg), f"README shows {flag}{arg or ''}; tk-bench's {flag} takes " + \
            ("a value" if takes_value else "no value")
