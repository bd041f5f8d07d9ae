"""Which setting makes gdn_decode hang at Hk=2 Hv=4 dk=32 dv=32 W=4 B=8 N=16 fp32 (tk-bench's small case)?
Each variant in its own child process under a timeout (a hung kernel stalls the GPU).

Session 7 (H200, 86ae02d's kernel; the heuristic then kept TMA on here): default (TMA, occupancy 3,
split 2), split 1, no state_indices, B=1, Hk=1 all never finished (40 s); TMA off, occupancy 0
(the compiler's) and dv=64 ([32, 64] fp32 tiles) finished with o rel. error 1.5-1.8e-3 (bf16 o)
and state 6e-8. cutile_decode.hang_risk now refuses TMA there and the heuristic turns it off, so
"default" runs TMA off and "tma" is refused before the launch.
    source .gpu-cutile/env.sh && HT=40 python3 benchmarks/probes/gdn_decode_hang_dk32.py"""
import dataclasses, subprocess, sys, time, os
V = sys.argv[1] if len(sys.argv) > 1 else None
if V is None:
    names = os.environ.get("VARIANTS", "default,tma,split1,noidx,occ0,B1,dv64,Hk1").split(",")
    for n in names:
        t0 = time.time()
        try:
            r = subprocess.run([sys.executable, __file__, n], capture_output=True, text=True, timeout=float(os.environ.get("HT", "40")))
            res = (r.stdout.strip().splitlines() or ["?"])[-1] if r.returncode == 0 else f"rc={r.returncode} {r.stderr.strip()[-300:]}"
        except subprocess.TimeoutExpired:
            res = "HANG (timeout)"
        print(f"{n:8s} {time.time() - t0:6.1f}s  {res}", flush=True)
    sys.exit(0)
import torch
from tilekernels.gdn import cutile_decode as cd, reference as ref
from tilekernels.gdn.bench import weights, mixed, decode_states
dev = torch.device("cuda")
Hk, Hv, dk, dv, W, B, N = 2, 4, 32, 32, 4, 8, 16
if V == "B1": B = 1
if V == "dv64": dv = 64
if V == "Hk1": Hk = 1
torch.manual_seed(0)
w, A, dt = weights(Hk, Hv, dk, dv, W, device=dev)
conv, ssm = decode_states(N, Hk, Hv, dk, dv, W, device=dev)
x = mixed((B,), Hk, Hv, dk, dv, device=dev)
idx = None if V == "noidx" else torch.randperm(N, device=dev)[:B].to(torch.int32)
cfg = cd.DecodeCfg.heuristic(Hk, Hv, dk, dv, W, 4)
split = None
if V == "tma": cfg = dataclasses.replace(cfg, TMA=True)
if V == "occ0": cfg = dataclasses.replace(cfg, OCC=0)
if V == "split1": split = 1
c64, s64 = conv.double(), ssm.double()
o64 = ref.decode(x.double(), c64, w.double(), A.double(), dt.double(), s64, idx, Hk=Hk)
o = torch.full((B, Hv, dv), float("nan"), dtype=x.dtype, device=dev)
L = cd.decode_launch(x, conv, w, A, dt, ssm, idx, o, Hk, cfg=cfg, split=split)
L.run()
torch.cuda.synchronize()
e = ((o.double() - o64).norm() / o64.norm()).item()
es = ((ssm.double() - s64).norm() / s64.norm()).item()
print(f"ok split={split or cfg.split(B, 132)} o_err={e:.2e} state_err={es:.2e}")
