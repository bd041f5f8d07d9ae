"""THD cp <-> hp all_to_all across ranks: registry path vs per-sequence reference (issue 14).

Each rank holds its zigzag shard x_local [T/cp, D] of 8 sequences (T = 65536 tokens,
Qwen3-Next GDN sections q=k=2048, v=z=4096, b=a=32, bf16) and runs, fwd + bwd,

    y = thd_cp_to_hp(x_local)      # [T, D/cp]
    z = thd_hp_to_cp(y)            # [T/cp, D]   (z == x_local)
    (z * dz).sum().backward()      # each backward is the other direction

through the registry (``--backend auto``: cutile on a GPU, torch on a CPU; or forced) and
through the per-sequence, per-section reference (tilekernels/cp/reference.py: one
all_to_all per (sequence, section)). It checks that the outputs and x's gradient are bit
identical, counts all_to_all_single calls per step (fused: 4 = 2 fwd + 2 bwd), times a step
(median of --iters, CUDA events / perf_counter, after warm-up), times one bare
all_to_all_single of the same [cp, T/cp, D/cp] buffer and reports the collective's share of
the fused step (4 bare a2a / step) and its bytes/s (bytes each rank sends to the others,
(cp-1)/cp of the buffer, per second). Rank 0 prints a JSON record and a short table; with
$OUT set the record goes to $OUT/cp_a2a_2gpu.json.

    torchrun --nproc-per-node 2 benchmarks/cp_a2a_2gpu.py            # 2 GPUs, NCCL
    python3 benchmarks/cp_a2a_2gpu.py --spawn 2                        # the same via mp.spawn
    python3 benchmarks/cp_a2a_2gpu.py --spawn 2 --smoke                # CPU, gloo, tiny shapes
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

SECTIONS = [2048, 2048, 4096, 4096, 32, 32]
SMOKE_SECTIONS = [8, 8, 16, 16, 4, 4]


@contextlib.contextmanager
def count_a2a():
    calls = []
    orig = dist.all_to_all_single

    def wrapped(*a, **k):
        calls.append(1)
        return orig(*a, **k)

    dist.all_to_all_single = wrapped
    try:
        yield calls
    finally:
        dist.all_to_all_single = orig


def _timer(dev):
    if dev.type == "cuda":
        def run(fn, iters):
            ts = []
            for _ in range(iters):
                dist.barrier()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                ts.append(a.elapsed_time(b))
            return statistics.median(ts)
    else:
        def run(fn, iters):
            ts = []
            for _ in range(iters):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(ts)
    return run


def worker(rank: int, world: int, args) -> dict | None:
    import registry
    from tilekernels.cp import bench as cpb
    from tilekernels.cp import reference as ref

    cuda = not args.smoke and torch.cuda.is_available()
    dev = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                                init_method=args.init, **({"device_id": dev} if cuda else {}))
    cp = world
    sections = SMOKE_SECTIONS if args.smoke else SECTIONS
    T = args.tokens if args.tokens else (32 * 2 * cp if args.smoke else 65536)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    cu = cpb.cu_seqlens(T, args.seqs, 2 * cp, "cpu")                 # global offsets, host (Megatron's way)
    cu_call = cu.to(dev) if args.cu_on_device else cu
    D = sum(sections)
    g = torch.Generator().manual_seed(1234)
    x_glob = torch.randn(T, D, generator=g).to(dtype)                  # the same on every rank
    x_loc = ref.zigzag_local(x_glob, cu, cp, rank).to(dev)
    dz = torch.randn(T, D, generator=g).to(dtype)
    dz_loc = ref.zigzag_local(dz, cu, cp, rank).to(dev)
    to_hp, to_cp = registry.get("thd_cp_to_hp"), registry.get("thd_hp_to_cp")
    kw = dict(split_sections=sections)
    chosen = to_hp.explain(x_loc, cu_call, **kw)
    backend = args.backend if args.backend != "auto" else next(b for b, ok, _ in chosen if ok)

    def fused():
        x = x_loc.detach().requires_grad_()
        y = to_hp(x, cu_call, backend=backend, **kw)
        z = to_cp(y, cu_call, backend=backend, **kw)
        z.backward(dz_loc)
        return y, z, x.grad

    def reference():
        x = x_loc.detach().requires_grad_()
        y = ref.thd_cp_to_hp(x, cu, **kw)
        z = ref.thd_hp_to_cp(y, cu, **kw)
        z.backward(dz_loc)
        return y, z, x.grad

    with count_a2a() as fused_calls:
        yf, zf, gf = fused()
    with count_a2a() as ref_calls:
        yr, zr, gr = reference()
    same = all(torch.equal(a, b) for a, b in ((yf, yr), (zf, zr), (gf, gr))) and torch.equal(zf, x_loc) \
        and torch.equal(gf, dz_loc)
    run = _timer(dev)
    for _ in range(args.warmup):
        fused()
        reference()
    fused_ms = run(fused, args.iters)
    ref_ms = run(reference, max(1, args.iters // 4))
    buf = torch.randn(cp, T // cp, D // cp, device=dev).to(dtype)
    out = torch.empty_like(buf)
    a2a_ms = run(lambda: dist.all_to_all_single(out, buf), args.iters)
    sent = buf.numel() * buf.element_size() * (cp - 1) // cp
    rec = dict(world=world, device=str(torch.cuda.get_device_name(dev)) if cuda else "cpu",
               backend=("nccl" if cuda else "gloo"), op_backend=backend, T=T, D=D, sections=sections,
               dtype=str(dtype), seqs=args.seqs, cu_on_device=args.cu_on_device,
               bitwise=bool(same), fused_a2a_calls_per_step=len(fused_calls), ref_a2a_calls_per_step=len(ref_calls),
               fused_ms=fused_ms, ref_ms=ref_ms, a2a_ms=a2a_ms,
               a2a_share_of_fused=4 * a2a_ms / fused_ms, a2a_sent_bytes=sent,
               a2a_GBps=sent / a2a_ms / 1e6 if a2a_ms > 0 else None)
    ok = torch.tensor([int(same and len(fused_calls) == 4)], device=dev)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    rec["all_ranks_ok"] = bool(ok.item())
    dist.barrier()
    dist.destroy_process_group()
    return rec if rank == 0 else None


def _report(rec: dict) -> None:
    print(json.dumps(rec))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "cp_a2a_2gpu.json"), "w") as f:
            json.dump(rec, f, indent=1)
    print(f"\n{rec['device']} x{rec['world']} ({rec['backend']}), T={rec['T']} D={rec['D']} {rec['dtype']}, "
          f"op backend {rec['op_backend']}")
    print(f"{'path':<10}{'ms/step':>10}{'a2a calls':>11}")
    print(f"{'fused':<10}{rec['fused_ms']:>10.3f}{rec['fused_a2a_calls_per_step']:>11}")
    print(f"{'reference':<10}{rec['ref_ms']:>10.3f}{rec['ref_a2a_calls_per_step']:>11}")
    print(f"bare all_to_all_single {rec['a2a_ms']:.3f} ms ({rec['a2a_GBps']:.1f} GB/s sent per rank), "
          f"4 of them = {100 * rec['a2a_share_of_fused']:.0f}% of the fused step; "
          f"bit identical: {rec['bitwise']}; all ranks ok: {rec['all_ranks_ok']}")


def _spawned(rank, world, args, q):
    rec = worker(rank, world, args)
    if rec is not None:
        q.put(rec)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spawn", type=int, default=0, help="start this many processes (else: torchrun's env)")
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny shapes, fp32")
    ap.add_argument("--backend", default="auto", choices=["auto", "cutile", "torch"])
    ap.add_argument("--tokens", type=int, default=0)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cu-on-device", action="store_true", help="pass cu_seqlens on the GPU")
    args = ap.parse_args()
    if args.spawn:
        import torch.multiprocessing as mp

        args.init = "file://" + os.path.join(tempfile.mkdtemp(prefix="cp-a2a-"), "store")
        q = mp.get_context("spawn").SimpleQueue()
        mp.start_processes(_spawned, args=(args.spawn, args, q), nprocs=args.spawn, join=True,
                           start_method="spawn")
        rec = q.get()
    else:
        args.init = "env://"
        rec = worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        if rec is None:
            return 0
    _report(rec)
    return 0 if rec["bitwise"] and rec["all_ranks_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
