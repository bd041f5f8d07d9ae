#!/usr/bin/env python3
"""Which misaligned input makes the cuTile gdn_decode kernel stall? (session 52: the registry's misaligned-input
test, gdn_decode fp32-state, never finished on an H100; bf16-state passed. Its case is B=8, Hk=2, Hv=4,
dk=dv=32, W=4, N=16: split 2 over each key head, the counters' path.)

cuTile compiles a separate kernel for a tensor whose base is not 16-byte aligned. ``cutile_decode.decode_into``
now hands the launch aligned copies, so this probe calls ``decode_launch`` directly (the raw kernel) with one input
group one element off its allocation's start.

  --cubins (CPU): each group's misaligned variant exported for sm_90 (the launch's constraints with that group's
      base alignment lowered to its element size), SASS instruction counts beside the aligned kernel's.
  --registry (GPU): the registry's misaligned gdn_decode fp32-state test with the fix bypassed, in a child process
      under HT seconds, each launch's misaligned inputs printed before it runs (the last one before a stall).
  (GPU, cuTile bundle): each group in its own child process under a timeout (HT seconds, default 60): "HANG" or
      the o / state relative errors against float64.
    source .gpu-cutile/env.sh && python3 benchmarks/probes/gdn_decode_misaligned.py [--bf16] [GROUP ...]

Session 52, --cubins on the CPU (fp32 state, gdn_decode_fwd): aligned 4712 instructions (30 SYNCS, 108 BRA);
misaligned ssm_state 15424 (2273 SYNCS, 1595 BRA), o 9016 (1503 SYNCS), conv_weight 4272 (685 SYNCS), mixed
4016; conv_state, A_log, dt_bias, state_indices unchanged.
Session 53, GPU (H100, fp32 state): every input group alone at B=256 finished and matched float64 (o 1.66e-3,
state 1.33e-7: the aligned kernel's errors); --registry stalled at the registry case's misaligned ssm_state launch
(the first five inputs' launches finished). So the stall is the misaligned-ssm_state kernel at the small case's
config (split 2, TMA off, [32, 32] tiles); the kernel itself never waits, so it is in cuTile's generated code.
"""
from __future__ import annotations

import collections
import dataclasses
import io
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

# launch-argument positions of each decode input (cutile_decode.decode_launch's argument tuple)
GROUPS = {"aligned": [], "mixed": [0, 1, 2], "conv_state": [3, 4], "conv_weight": [5, 6], "A_log": [7],
          "dt_bias": [8], "ssm_state": [9], "state_indices": [10], "o": [11]}
NAMES = ["mixed", "conv_state", "conv_weight", "A_log", "dt_bias", "ssm_state", "state_indices", "o"]
KEYS = ["UTMALDG", "UTMASTG", "LDG", "STG", "SYNCS", "BRA", "BAR", "FFMA"]


def cubins(groups, state_dtype) -> None:
    from cuda.tile.compilation import CallingConvention, KernelSignature, export_kernel

    from tilekernels import _cutile as C
    from tilekernels.gdn import cutile_decode as cd
    tool = os.environ.get("NVDISASM", "nvdisasm")
    ln = cd.representative_launches(B=256, N=256, state_dtype=state_dtype)["gdn_decode.fwd"][0]
    print(ln.kernel._pyfunc.__name__, ln.cfg)
    for g in groups:
        cons = [dataclasses.replace(C._constraint(a), base_addr_divisible_by=a.element_size())
                if i in GROUPS[g] else C._constraint(a) for i, a in enumerate(ln.args)]
        buf = io.BytesIO()
        export_kernel(ln.compiled_kernel(), [KernelSignature(cons, CallingConvention.cutile_python_v1())], buf,
                      gpu_code="sm_90", output_format="cubin")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(buf.getvalue())
            f.flush()
            sass = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
        ops = collections.Counter(m.group(1).split(".")[0] for m in re.finditer(
            r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass, re.M))
        print(f"{g:14s} instructions {sum(ops.values()):6d}  " + "  ".join(f"{k} {ops.get(k, 0)}" for k in KEYS),
              flush=True)


def child(group: str, state_dtype) -> None:
    from tilekernels.gdn import bench as mk
    from tilekernels.gdn import cutile_decode as cd
    from tilekernels.gdn import reference as ref
    from tilekernels.testing import misaligned_copy
    dev = torch.device("cuda")
    Hk, Hv, dk, dv, W, B, N = 16, 32, 128, 128, 4, 256, 256
    torch.manual_seed(0)
    w, A, dt = mk.weights(Hk, Hv, dk, dv, W, device=dev)
    conv, ssm = mk.decode_states(N, Hk, Hv, dk, dv, W, device=dev, state_dtype=state_dtype)
    x = mk.mixed((B,), Hk, Hv, dk, dv, device=dev)
    idx = torch.randperm(N, device=dev)[:B].to(torch.int32)
    o = torch.full((B, Hv, dv), float("nan"), dtype=x.dtype, device=dev)
    c64, s64 = conv.double(), ssm.double()
    o64 = ref.decode(x.double(), c64, w.double(), A.double(), dt.double(), s64, idx, Hk=Hk)
    ts = [x, conv, w, A, dt, ssm, idx, o]
    if group != "aligned":
        i = NAMES.index(group)
        ts[i] = misaligned_copy(ts[i])
    cd.decode_launch(*ts, Hk).run()
    torch.cuda.synchronize()
    eo = ((ts[7].double() - o64).norm() / o64.norm()).item()
    es = ((ts[5].double() - s64).norm() / s64.norm()).item()
    print(f"ok o_err={eo:.2e} state_err={es:.2e}")


def registry_child() -> None:
    """The registry's misaligned-input test for gdn_decode fp32-state (the call that never finished in session 52)
    with the fix bypassed (decode_into's aligned16 made the identity): each launch prints its misaligned inputs
    before it runs, so the last line before a stall names the input whose kernel stalled."""
    import pytest

    from tilekernels.gdn import cutile_decode as cd
    cd.aligned16 = lambda t: t
    launch = cd.decode_launch

    def spy(*a, **k):
        bad = [NAMES[i] for i, t in enumerate(a[:8]) if isinstance(t, torch.Tensor) and t.data_ptr() % 16]
        print(f"launch B={a[0].shape[0]} misaligned={bad}", flush=True)
        return launch(*a, **k)

    cd.decode_launch = spy
    sys.exit(pytest.main(["-q", "-s", "-p", "no:cacheprovider", "tests/registry/test_registry_hot_path.py",
                          "-k", "misaligned and gdn_decode-fp32"]))


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    sd = torch.bfloat16 if "--bf16" in sys.argv else torch.float32
    if "--registry-child" in sys.argv:
        return registry_child()
    if "--registry" in sys.argv:
        try:
            r = subprocess.run([sys.executable, __file__, "--registry-child"], capture_output=True, text=True,
                               timeout=float(os.environ.get("HT", "60")))
            out, res = r.stdout, f"rc={r.returncode}"
        except subprocess.TimeoutExpired as e:
            out, res = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "HANG (timeout)"
        print("\n".join(line for line in out.splitlines() if line.startswith("launch") or "passed" in line
                        or "failed" in line), f"\nregistry test, fix bypassed: {res}", flush=True)
        return
    if "--child" in sys.argv:
        return child(args[0], sd)
    groups = args or list(GROUPS)
    if "--cubins" in sys.argv:
        return cubins(groups, sd)
    for g in groups:
        t0 = time.time()
        try:
            r = subprocess.run([sys.executable, __file__, g, "--child"] + (["--bf16"] if sd != torch.float32 else []),
                               capture_output=True, text=True, timeout=float(os.environ.get("HT", "60")))
            res = (r.stdout.strip().splitlines() or ["?"])[-1] if r.returncode == 0 else \
                f"rc={r.returncode} {r.stderr.strip()[-300:]}"
        except subprocess.TimeoutExpired:
            res = "HANG (timeout)"
        print(f"{g:14s} {time.time() - t0:6.1f}s  {res}", flush=True)


if __name__ == "__main__":
    main()
