"""Registry overhead per op: host microseconds per call through ``registry.get(name)(...)``
against the same call of the op's functional entry (the backend the registry picks,
every param given), without and with gradients, on the small tk-bench shapes (so
the host cost, not the kernels, is what differs).

``validate_us`` is the registry alone: the same call with the entry stubbed out (best
of the rounds), which the noise of the op's own host time does not blur. Each row
times both sides interleaved (median of rounds of N calls; on CUDA one
synchronize per round). fwd+bwd steps set the leaves' grads to None and
backpropagate the same pre-made grad outputs. On CUDA it also reports what the
device-side value checks cost on the GPU: CUDA-graph replay time of the registry
call minus the entry call, for ops with value rules on GPU tensors.

    python3 benchmarks/host_overhead.py [--device cuda] [--json PATH] [--src DIR]

``--src DIR`` imports registry/specs/tilekernels from another checkout (e.g. an
older commit's ``git archive``) so before and after run on one machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json")
    ap.add_argument("--src", help="import the library from this directory instead")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--label", default="")
    return ap.parse_args()


A = _args()
if A.src:
    sys.path.insert(0, A.src)

import torch  # noqa: E402

import registry  # noqa: E402

COLLECTIVES = {"thd_cp_to_hp", "thd_hp_to_cp", "thd_cp_a2a_perm"}


# tiny shapes: the op's own work is small, so the host cost is what the rows compare
TINY = {"T": 8, "C": 64, "M": 64, "K": 64, "N": 32, "R": 32, "F": 256, "H": 256, "G": 2, "B": 2,
        "dk": 16, "dv": 16}


def cases():
    import dataclasses

    from tilekernels.gdn import bench as gdnb
    from tilekernels.mhc import bench as mhcb
    from tilekernels.moe import bench as moeb

    out = []
    for c in (c for m in (mhcb, moeb, gdnb) for c in m.cases("cpu") if c.op not in COLLECTIVES):
        d = {k: TINY.get(k, v) for k, v in c.dims.items()}
        if c.op == "mhc_proj_rms":
            d.update(M=8, K=4 * 64, N=24)
        if c.op.startswith("gdn"):
            d["T"] = 16 if c.variant.startswith("thd") else 8
            d.update(B=2, N=4) if c.op == "gdn_decode" else None
        out.append(dataclasses.replace(c, dims=d))
    return out


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def paired_us(fa, fb, dev, calls, rounds):
    """Median host us per call of fa and fb, measured in alternating rounds."""
    for f in (fa, fb):
        for _ in range(20):
            f()
    _sync(dev)
    ta, tb = [], []
    for _ in range(rounds):
        for f, out in ((fa, ta), (fb, tb)):
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            _sync(dev)
            out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(ta), statistics.median(tb)


def _stubbed_us(op, args, params, dev):
    """Host us of ``op(*args, **params)`` with the op's entry replaced by a no-op: what the
    registry itself costs per call (key, cache lookup, value checks), best of the rounds."""
    stub = lambda *a, **k: None  # noqa: E731
    old_style = not hasattr(op, "_entry")  # older checkouts cache `entry` in the instance dict
    saved = op.__dict__.get("entry") if old_style else op._entry
    if old_style:
        op.__dict__["entry"] = stub
    else:
        op._entry = stub
    try:
        for _ in range(50):
            op(*args, **params)
        _sync(dev)
        best = float("inf")
        for _ in range(A.rounds):
            t0 = time.perf_counter()
            for _ in range(A.calls):
                op(*args, **params)
            best = min(best, (time.perf_counter() - t0) / A.calls * 1e6)
        _sync(dev)
        return best
    finally:
        if old_style:
            op.__dict__.pop("entry", None)
            if saved is not None:
                op.__dict__["entry"] = saved
        else:
            op._entry = saved


def graph_us(fn):
    """GPU time per replay of fn captured in a CUDA graph (median, us)."""
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3


def main():
    dev = torch.device(A.device)
    rows = []
    for case in cases():
        op = registry.get(case.op)
        args, params = case.make(case.dims, dev)
        names = [t.name for t in op.spec.inputs]
        bound = op.bind(*args, **params)
        with torch.no_grad():  # the backend of the no-grad rows (choose reads the grad mode)
            chosen = op.choose(bound)
        full = dict(bound.params)
        tensors = bound.args()
        name = f"{case.op}" + (f"[{case.variant}]" if case.variant else "")
        row = {"op": name, "backend": chosen}
        with torch.no_grad():
            reg, ent = paired_us(lambda: op(*args, **params), lambda: op.entry(*tensors, backend=chosen, **full),
                                 dev, A.calls, A.rounds)
        row.update(nograd_registry_us=round(reg, 1), nograd_entry_us=round(ent, 1), nograd_extra_us=round(reg - ent, 1))
        with torch.no_grad():  # the registry alone: the same call with the entry stubbed out (no noise from the op)
            row.update(validate_us=round(_stubbed_us(op, args, params, dev), 2))
        leaves = [a for n, a in zip(names, args) if n in case.grad_inputs and isinstance(a, torch.Tensor)]
        if leaves and op.spec.differentiable:
            for t in leaves:
                t.requires_grad_(True)
            first = op(*args, **params)
            outs = list(first) if isinstance(first, tuple) else [first]
            gos = [torch.randn_like(o) for o in outs]

            def step(f):
                def run():
                    for t in leaves:
                        t.grad = None
                    o = f()
                    o = list(o) if isinstance(o, tuple) else [o]
                    torch.autograd.backward(o, gos)
                return run
            row.update(validate_grad_us=round(_stubbed_us(op, args, params, dev), 2))  # grad mode, leaves requiring grad
            reg, ent = paired_us(step(lambda: op(*args, **params)),
                                 step(lambda: op.entry(*tensors, backend=chosen, **full)), dev,
                                 max(A.calls // 4, 20), A.rounds)
            row.update(fwdbwd_registry_us=round(reg, 1), fwdbwd_entry_us=round(ent, 1),
                       fwdbwd_extra_us=round(reg - ent, 1))
            for t in leaves:
                t.requires_grad_(False)
                t.grad = None
        if dev.type == "cuda" and case.op in ("grouped_linear", "grouped_mlp_mxfp8", "gdn_pre_gated", "gdn_decode"):
            # the same call with its value-rule tensors on the GPU: the rules run as device checks
            gargs = [a.to(dev) if isinstance(a, torch.Tensor) and a.device.type == "cpu" else a for a in args]
            gt = [a.to(dev) if isinstance(a, torch.Tensor) and a.device.type == "cpu" else a for a in tensors]
            # (tensors already on the GPU count too: the GDN cases make cu_seqlens / state_indices there)
            if case.op not in ("grouped_linear", "grouped_mlp_mxfp8"):  # MoE's reference reads m_splits on the host
                with torch.no_grad():
                    reg, ent = paired_us(lambda: op(*gargs, **params), lambda: op.entry(*gt, backend=chosen, **full),
                                         dev, A.calls, A.rounds)
                    row.update(gpu_values_registry_us=round(reg, 1), gpu_values_entry_us=round(ent, 1))
                    gr = graph_us(lambda: op(*gargs, **params))
                    ge = graph_us(lambda: op.entry(*gt, backend=chosen, **full))
                row.update(device_checks_gpu_us=round(gr - ge, 2), graph_registry_us=round(gr, 2),
                           graph_entry_us=round(ge, 2))
        rows.append(row)
        print(json.dumps(row), flush=True)
    keys = ["op", "backend", "validate_us", "validate_grad_us", "nograd_extra_us", "fwdbwd_extra_us", "nograd_registry_us", "nograd_entry_us",
            "device_checks_gpu_us"]
    print("\n" + "  ".join(f"{k:>22}" if i else f"{k:<34}" for i, k in enumerate(keys)))
    for r in rows:
        print("  ".join(f"{str(r.get(k, '-')):>22}" if i else f"{str(r.get(k, '-')):<34}" for i, k in enumerate(keys)))
    if A.json:
        meta = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
                "label": A.label, "src": A.src, "calls": A.calls, "rounds": A.rounds}
        with open(A.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
