"""Every gdn spec rule refuses a violating input with registry.SpecError naming the op."""
import pytest
import torch

import registry
from registry import SpecError
from tilekernels.gdn import bench as mk

PRE = registry.get("gdn_pre_gated")
DEC = registry.get("gdn_decode")
Hk, Hv, dk, dv, W = 2, 4, 4, 4, 4
P = dict(Hk=Hk, dk=dk, dv=dv)


def pre_args(lead=(2, 5), dtype=torch.bfloat16):
    w, A, dt = mk.weights(Hk, Hv, dk, dv, W, dtype=dtype,
                          gate_dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    return [mk.mixed(lead, Hk, Hv, dk, dv, dtype=dtype), w, A, dt]


def dec_args(B=3, N=4, dtype=torch.bfloat16):
    w, A, dt = mk.weights(Hk, Hv, dk, dv, W, dtype=dtype,
                          gate_dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    conv, ssm = mk.decode_states(N, Hk, Hv, dk, dv, W, dtype=dtype,
                                 state_dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    return [mk.mixed((B,), Hk, Hv, dk, dv, dtype=dtype), conv, w, A, dt, ssm]


def refused(op, args, kwargs, *words):
    """op refuses the call with a SpecError naming op and words, and writes nothing: every tensor
    argument (gdn_decode's conv_state and ssm_state are updated in place by a valid call) is
    bitwise what it was."""
    tensors = [t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor) and not t.is_meta]
    before = [t.detach().clone() for t in tensors]
    with pytest.raises(SpecError) as e:
        op(*args, **kwargs)
    for t, b in zip(tensors, before):
        same = torch.allclose(t, b, rtol=0, atol=0, equal_nan=True) if t.is_floating_point() else torch.equal(t, b)
        assert same, "a refused call wrote a tensor"
    msg = str(e.value)
    assert op.name in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def test_valid_calls_pass():
    PRE(*pre_args(), **P)
    PRE(*pre_args((9,)), cu_seqlens=mk.cu_seqlens([4, 0, 5]), **P)
    DEC(*dec_args(), Hk=Hk)
    DEC(*dec_args(), torch.tensor([0, -1, 3], dtype=torch.int32), Hk=Hk)


# ------------------------------------------------------------------ gdn_pre_gated


def test_pre_hv_not_multiple_of_hk():
    # Hk=3, Hv=4: shapes consistent, head grouping impossible
    w, A, dt = mk.weights(3, 4, dk, dv, W)
    refused(PRE, [mk.mixed((1, 3), 3, 4, dk, dv), w, A, dt], dict(Hk=3, dk=dk, dv=dv), "Hv % Hk == 0")


def test_hv_fewer_than_hk_refused():
    """Hv % Hk == 0 also refuses Hk > Hv (Hk=4, Hv=2: 2 % 4 != 0), in both ops: a value head would serve less
    than one key head."""
    w, A, dt = mk.weights(4, 2, dk, dv, W)
    refused(PRE, [mk.mixed((1, 3), 4, 2, dk, dv), w, A, dt], dict(Hk=4, dk=dk, dv=dv), "Hv % Hk == 0")
    conv, ssm = mk.decode_states(2, 4, 2, dk, dv, W)
    refused(DEC, [mk.mixed((2,), 4, 2, dk, dv), conv, w, A, dt, ssm], dict(Hk=4), "Hv % Hk == 0")


def test_pre_d_mismatch():
    a = pre_args()
    refused(PRE, [a[0][..., :-1].contiguous()] + a[1:], P, "tensor mixed")
    refused(PRE, a, dict(Hk=1, dk=dk, dv=dv), "tensor mixed")  # wrong head count
    refused(PRE, a, dict(Hk=Hk, dk=dk, dv=dv + 1), "tensor mixed")


def test_pre_conv_weight_and_gate_shapes():
    a = pre_args()
    refused(PRE, [a[0], a[1][:-1].contiguous(), a[2], a[3]], P, "tensor conv_weight")
    refused(PRE, [a[0], a[1], a[2], a[3][:-1].contiguous()], P, "tensor dt_bias")
    refused(PRE, [a[0], a[1][None], a[2], a[3]], P, "tensor conv_weight")


def test_pre_cu_seqlens_rules():
    a = pre_args((9,))
    for cu, why in (([1, 4, 9], "start at 0"), ([0, 5, 4, 9], "nondecreasing"), ([0, 4, 8], "end at T_total"),
                    ([0, 4, 10], "end at T_total"), ([-1, 4, 9], "start at 0")):
        refused(PRE, a, dict(P, cu_seqlens=torch.tensor(cu, dtype=torch.int32)), why)
    refused(PRE, a, dict(P, cu_seqlens=torch.tensor([0, 9], dtype=torch.int64)), "tensor cu_seqlens", "int64")
    refused(PRE, a, dict(P, cu_seqlens=torch.zeros(0, dtype=torch.int32)), "dim S")
    # THD needs a 2-d mixed, BSHD a 3-d one
    refused(PRE, pre_args((1, 9)), dict(P, cu_seqlens=mk.cu_seqlens([9])), "tensor mixed", "2 dims")
    refused(PRE, a, P, "tensor mixed", "3 dims")


def test_pre_dtypes():
    a = pre_args()
    refused(PRE, [a[0].half()] + a[1:], P, "tensor mixed", "float16")
    refused(PRE, [a[0], a[1], a[2].bfloat16(), a[3]], P, "tensor A_log")
    refused(PRE, [a[0], a[1], a[2], a[3].bfloat16()], P, "tensor dt_bias")
    refused(PRE, [a[0].double()] + a[1:], P, "float64 mixed")


def test_pre_params_and_strides():
    a = pre_args()
    refused(PRE, a, dict(P, repeat_qk=1), "param repeat_qk")
    refused(PRE, a, dict(P, eps=-1.0), "param eps")
    # 0, and a positive eps that the kernels' fp32 flushes to 0 (an all-zero q / k head: 0 * rsqrt(0) = NaN)
    for eps in (0.0, -0.0, 1e-40, 1e-50):
        refused(PRE, a, dict(P, eps=eps), "param eps", "expected >= 1.17")
    refused(PRE, a, dict(P, dk=0), "param dk")
    refused(PRE, a, dict(P, Hk=2.0), "param Hk")
    t = a[0].transpose(0, 1).contiguous().transpose(0, 1)
    refused(PRE, [t] + a[1:], P, "tensor mixed", "contiguous")
    refused(PRE, a, dict(P, conv_state=a[0]), "conv_state", "unknown argument")


def test_pre_zero_sized_head_and_conv_dims():
    """W, Hv, Hk, dk and dv have a lower bound of 1. Without it a call crashed past validation: W = 0 made a
    conv_state of negative width, and dk = 0 divided by zero in the scale."""
    a = pre_args()
    refused(PRE, [a[0], a[1][:, :0].contiguous(), a[2], a[3]], dict(P, return_conv_state=True), "1 <= W")
    refused(PRE, [a[0], a[1][:, :0].contiguous(), a[2], a[3]], P, "1 <= W")
    w, A, dt = mk.weights(Hk, Hv, dk, dv, W)
    x = torch.randn(1, 3, 2 * Hk * dk).to(torch.bfloat16)     # no value heads: D = the q and k slices
    refused(PRE, [x, w[:2 * Hk * dk].contiguous(), A[:0], dt[:0]], P, "1 <= Hv")
    for bad in (dict(Hk=0), dict(dk=0), dict(dv=0)):
        refused(PRE, a, dict(P, **bad), f"param {next(iter(bad))}")


# ------------------------------------------------------------------ gdn_decode


def test_decode_hv_not_multiple_of_hk():
    w, A, dt = mk.weights(3, 4, dk, dv, W)
    conv, ssm = mk.decode_states(2, 3, 4, dk, dv, W)
    refused(DEC, [mk.mixed((2,), 3, 4, dk, dv), conv, w, A, dt, ssm], dict(Hk=3), "Hv % Hk == 0")


def test_decode_shapes():
    a = dec_args()
    refused(DEC, a, dict(Hk=1), "tensor mixed")
    refused(DEC, [a[0], a[1][..., :-1].contiguous()] + a[2:], dict(Hk=Hk), "tensor conv_state", "W - 1")
    refused(DEC, a[:5] + [a[5][:, :, :-1].contiguous()], dict(Hk=Hk), "tensor mixed")  # dk from ssm_state
    refused(DEC, a[:5] + [a[5][:-1].contiguous()], dict(Hk=Hk), "tensor ssm_state")  # N mismatch
    refused(DEC, dec_args(B=5, N=4), dict(Hk=Hk), "N >= B")


def test_decode_zero_sized_head_dims():
    """dk and dv (bound from ssm_state) have a lower bound of 1: without it dk = 0 reached the default scale
    dk ** -0.5 (ZeroDivisionError) instead of a refusal."""
    for kd, vd in ((0, dv), (dk, 0)):
        w, A, dt = mk.weights(Hk, Hv, kd, vd, W)
        conv, ssm = mk.decode_states(4, Hk, Hv, kd, vd, W)
        refused(DEC, [mk.mixed((3,), Hk, Hv, kd, vd), conv, w, A, dt, ssm], dict(Hk=Hk),
                "1 <= dk" if kd == 0 else "1 <= dv")


def test_decode_state_indices():
    a = dec_args()
    for idx in ([0, 4, 1], [0, -2, 1]):
        refused(DEC, a, dict(Hk=Hk, state_indices=torch.tensor(idx, dtype=torch.int32)), "[-1, N)")
    one = dec_args(B=1)   # a batch of one row is held to the slot range too
    for idx in ([4], [-2]):
        refused(DEC, one, dict(Hk=Hk, state_indices=torch.tensor(idx, dtype=torch.int32)), "[-1, N)")
    DEC(*one, Hk=Hk, state_indices=torch.tensor([3], dtype=torch.int32))
    refused(DEC, a, dict(Hk=Hk, state_indices=torch.tensor([0, 1, 2])), "tensor state_indices", "int64")
    refused(DEC, a, dict(Hk=Hk, state_indices=torch.tensor([0, 1], dtype=torch.int32)), "tensor state_indices")
    refused(DEC, a, dict(Hk=Hk, state_indices=torch.tensor([2, 0, 2], dtype=torch.int32)), "same state slot")
    # -1 padding may repeat
    DEC(*a, Hk=Hk, state_indices=torch.tensor([-1, 0, -1], dtype=torch.int32))


def test_decode_dtypes():
    a = dec_args()
    refused(DEC, [a[0], a[1].float()] + a[2:], dict(Hk=Hk), "tensor conv_state")
    refused(DEC, a[:5] + [a[5].half()], dict(Hk=Hk), "tensor ssm_state")
    refused(DEC, [a[0].half()] + a[1:], dict(Hk=Hk), "tensor mixed")
    b = dec_args(dtype=torch.float64)
    refused(DEC, b[:5] + [b[5].float()], dict(Hk=Hk), "float64 ssm_state")
    refused(DEC, b[:2] + [b[2].float()] + b[3:], dict(Hk=Hk), "float64 mixed")


def test_decode_forward_only_and_params():
    a = dec_args(dtype=torch.float32)
    a[0].requires_grad_()
    refused(DEC, a, dict(Hk=Hk), "forward-only")
    a[0].requires_grad_(False)
    refused(DEC, a, dict(Hk=Hk, scale="x"), "param scale")
    for eps in (0.0, 1e-45):  # would write NaN into ssm_state's slots for an all-zero q / k head (refused: untouched)
        refused(DEC, a, dict(Hk=Hk, eps=eps), "param eps", "expected >= 1.17")
    t = a[5].transpose(2, 3).contiguous().transpose(2, 3)
    refused(DEC, a[:5] + [t], dict(Hk=Hk), "tensor ssm_state", "contiguous")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_device_mismatch():
    a = pre_args()
    refused(PRE, [a[0].cuda()] + a[1:], P, "device")


def test_cu_seqlens_may_stay_on_the_cpu():
    """OPS.md's hot path: cu_seqlens may come on the CPU beside GPU tensors (a meta mixed stands
    in for one here): accepted, and its value rules run on the host (a bad one is refused)."""
    a = pre_args((9,))
    a = [t.to("meta") for t in a]
    PRE.bind(*a, cu_seqlens=mk.cu_seqlens([4, 0, 5]), **P)
    refused(PRE, a, dict(P, cu_seqlens=torch.tensor([0, 5, 4, 9], dtype=torch.int32)), "cu_seqlens")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
def test_cpu_cu_seqlens_on_the_gpu_backends():
    """A CPU cu_seqlens gives bitwise the GPU one's outputs and gradients (the kernels copy it
    without a sync); inside a CUDA-graph capture it is refused, naming it."""
    a = [t.cuda().requires_grad_(t.is_floating_point()) for t in pre_args((9,))]
    cu = mk.cu_seqlens([4, 0, 5])
    runs = []
    for c in (cu, cu.cuda()):
        outs = PRE(*a, cu_seqlens=c, **P)
        dys = [torch.ones_like(o) for o in outs]
        runs.append([*outs, *torch.autograd.grad(outs, a, dys)])
    for i, (x, y) in enumerate(zip(*runs)):
        assert torch.equal(x, y), f"output {i}"
    with torch.no_grad():
        if PRE.choose(PRE.bind(*a, cu_seqlens=cu, **P)) == "torch":
            pytest.skip("no GPU backend takes this call here: the capture part is about their copy")
        PRE(*a, cu_seqlens=cu.cuda(), **P)  # warm-up outside the capture
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="cu_seqlens"):
            with torch.cuda.graph(g):
                PRE(*a, cu_seqlens=cu, **P)


@pytest.mark.parametrize("layout", ["bshd", "thd"])
@pytest.mark.parametrize("repeat_qk", [True, False])
def test_declared_output_shapes_and_dtypes(layout, repeat_qk):
    """The spec's output shapes/dtypes, evaluated on the bound call, are what the op returns."""
    from specs import expr
    from registry.validate import dtype_name

    def check(op, args, kwargs, outs):
        bound = op.bind(*args, **kwargs)
        env = {**bound.dims, **bound.params}
        decl = [t for t in op.spec.outputs if not t.optional or len(outs) == len(op.spec.outputs)]
        assert len(decl) == len(outs)
        for t, o in zip(decl, outs):
            want = [d if isinstance(d, int) else expr.evaluate(d, env) for d in t.shape_for(bound.layout)]
            assert list(o.shape) == want, t.name
            allowed = [dtype_name(bound.tensors[t.dtypes[5:]].dtype)] if isinstance(t.dtypes, str) else t.dtypes
            assert dtype_name(o.dtype) in allowed, t.name

    kw = dict(P, repeat_qk=repeat_qk, return_conv_state=True)
    if layout == "thd":
        kw["cu_seqlens"] = mk.cu_seqlens([3, 1, 5])
    a = pre_args((9,) if layout == "thd" else (2, 5))
    check(PRE, a, kw, PRE(*a, **kw))
    d = dec_args()
    check(DEC, d, dict(Hk=Hk), (DEC(*d, Hk=Hk),))


def test_decode_float64_mixed_needs_float64_state():
    a = dec_args(dtype=torch.float64)
    a[5] = a[5].float()
    refused(DEC, a, dict(Hk=Hk), "dtype(ssm_state)='float32'")
