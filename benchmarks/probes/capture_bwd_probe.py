"""Which way of capturing forward+backward in one CUDA graph works here: a pure-torch op and a
registry op (mhc_h_aggregate), leaves made on the legacy stream or on the warm-up stream, the
capture on a new pool stream or on the warm-up stream, backward()/autograd.grad."""
import itertools
import traceback

import torch

import registry


def run(kind, leaves_on_side, capture_on_side, use_grad):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    ctx = torch.cuda.stream(side) if leaves_on_side else torch.cuda.stream(torch.cuda.current_stream())
    with ctx:
        x = torch.randn(64, 4, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        h = torch.rand(64, 4, device="cuda", requires_grad=True)
        go = torch.randn(64, 256, device="cuda")
    torch.cuda.synchronize()
    op = registry.get("mhc_h_aggregate")
    f = (lambda: (x.float() * h[:, :, None]).sum(1)) if kind == "torch" else (lambda: op(x, h))

    def step():
        loss = (f().float() * go).sum()
        if use_grad:
            return list(torch.autograd.grad(loss, [x, h]))
        x.grad = h.grad = None
        loss.backward()
        return [x.grad, h.grad]

    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, stream=side if capture_on_side else None):
            out = step()
        g.replay()
        torch.cuda.synchronize()
        want = step()
        torch.cuda.synchronize()
        return "ok" if all(torch.equal(a, b) for a, b in zip(out, want)) else "differs"
    except Exception as e:  # noqa: BLE001
        return type(e).__name__ + ": " + str(e).splitlines()[0][:90]


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1:  # one combo per process: a failed capture leaves the RNG in capture state
        kind, a, b, c = sys.argv[1], *(v == "1" for v in sys.argv[2:5])
        print((kind, a, b, c), run(kind, a, b, c), flush=True)
    else:
        for combo in itertools.product(("torch", "registry"), "01", "01", "01"):
            import subprocess
            subprocess.run([sys.executable, __file__, *combo])
