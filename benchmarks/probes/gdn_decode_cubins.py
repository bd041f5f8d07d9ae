#!/usr/bin/env python3
"""Resources of the gdn_decode cubins in cuTile's disk cache (``~/.cache/cutile-python/cache.db``
or the path given): per cached kernel the compile-time name (constants and argument
constraints), registers, shared memory, stack, threads per block (EIATTR_REQNTID) and the SASS
instruction mix. Run on the device host after a benchmark to see what its JIT built (an AOT
``export_cubin`` on a CPU host can specialize differently), e.g.
    python3 benchmarks/probes/gdn_decode_cubins.py > "$OUT/cubins.txt"
Needs cuobjdump on PATH (the device image has it).
"""
from __future__ import annotations

import collections
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile

KEYS = ["FFMA", "FMUL", "FADD", "SHFL", "LDG", "STG", "LDS", "STS", "BAR", "UTMALDG", "UTMASTG", "MUFU", "LDL",
        "STL", "HMMA", "ATOMG"]


def summary(cubin: bytes, tool: str = "cuobjdump") -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
        elf = subprocess.run([tool, "-elf", f.name], capture_output=True, text=True).stdout
    ops = collections.Counter(m.group(1) for m in re.finditer(
        r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", sass, re.M))
    reg = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+)", res)
    ntid = re.search(r"EIATTR_REQNTID\s+Format:\s+\S+\s+Value:\s+(0x\w+)", elf)
    return (f"threads={int(ntid.group(1), 16) if ntid else '?'} regs={reg.group(1) if reg else '?'} "
            f"stack={reg.group(2) if reg else '?'} smem={reg.group(3) if reg else '?'} n={sum(ops.values())} "
            + " ".join(f"{k}={ops[k]}" for k in KEYS if ops[k]))


def main():
    db = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/cutile-python/cache.db")
    con = sqlite3.connect(db)
    for blob, meta in con.execute("select blob, metadata from cache order by atime"):
        names = json.loads(meta or "{}").get("kernel_names", [])
        if not any(n.startswith("gdn_decode") for n in names):
            continue
        print(names[0][:400])
        try:
            print("   ", summary(blob), flush=True)
        except Exception as e:  # a blob that is not a plain cubin
            print("    (no summary:", repr(e)[:200], ")", flush=True)


if __name__ == "__main__":
    main()
