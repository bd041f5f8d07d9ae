"""Every rule of the moe specs refuses a violating input with registry.SpecError naming the op
(and the offending item), before any kernel runs; the conditional rules do not fire outside
their condition."""
import pytest
import torch

import registry
from registry import SpecError

bf = torch.bfloat16


def t(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape).to(dtype).requires_grad_(grad)


def e4m3(*shape):
    return torch.randn(*shape).to(torch.float8_e4m3fn)


def scales(*shape):
    return torch.randint(100, 140, shape, dtype=torch.uint8)


def ms(*v, dtype=torch.int64):
    return torch.tensor(v, dtype=dtype)


def mlp(M=64, H=256, F=256, G=2, splits=None, grad=False, dtype=bf, probs_dtype=torch.float32, **kw):
    splits = splits if splits is not None else (M // 2, M - M // 2) if G == 2 else (M,) + (0,) * (G - 1)
    return ((t(M, H, dtype=dtype, grad=grad), t(M, dtype=probs_dtype, grad=grad), ms(*splits),
             t(G, 2 * F, H, dtype=dtype, grad=grad), t(G, H, F, dtype=dtype, grad=grad)), kw)


CASES = {
    # name: (op, args, kwargs, text expected in the message besides the op name)
    "quant_rowwise_K32": ("mxfp8_quantize", (t(32, 48),), {}, "K % 32"),
    "quant_columnwise_R32": ("mxfp8_quantize", (t(48, 32),), {"axis": "columnwise"}, "R % 32"),
    "quant_both_R32": ("mxfp8_quantize", (t(48, 32),), {"axis": "both"}, "R % 32"),
    "quant_both_K32": ("mxfp8_quantize", (t(32, 48),), {"axis": "both"}, "K % 32"),
    "quant_bad_axis": ("mxfp8_quantize", (t(32, 32),), {"axis": "diagonal"}, "axis"),
    "quant_int_dtype": ("mxfp8_quantize", (torch.ones(32, 32, dtype=torch.int32),), {}, "dtype"),
    "quant_3d": ("mxfp8_quantize", (t(2, 32, 32),), {}, "2 dims"),
    "quant_noncontig": ("mxfp8_quantize", (t(64, 64)[:, ::2],), {}, "contiguous"),
    "deq_rowwise_K32": ("mxfp8_dequantize", (e4m3(32, 48), scales(32, 1)), {}, "K % 32"),
    "deq_columnwise_R32": ("mxfp8_dequantize", (e4m3(48, 32), scales(1, 32)), {"axis": "columnwise"}, "R % 32"),
    "deq_scale_shape": ("mxfp8_dequantize", (e4m3(64, 64), scales(2, 64)), {}, "scales"),
    "deq_scale_shape_col": ("mxfp8_dequantize", (e4m3(64, 64), scales(64, 2)), {"axis": "columnwise"}, "scales"),
    "deq_data_dtype": ("mxfp8_dequantize", (t(64, 64), scales(64, 2)), {}, "data"),
    "deq_scale_dtype": ("mxfp8_dequantize", (e4m3(64, 64), scales(64, 2).int()), {}, "scales"),
    "deq_out_dtype": ("mxfp8_dequantize", (e4m3(64, 64), scales(64, 2)), {"out_dtype": "float16"}, "out_dtype"),
    "gl_sum": ("grouped_linear", (t(10, 8), t(2, 4, 8), ms(3, 6)), {}, "sum(values(m_splits)) == M"),
    "gl_negative": ("grouped_linear", (t(10, 8), t(2, 4, 8), ms(12, -2)), {}, "min(values(m_splits)) >= 0"),
    "gl_above_M": ("grouped_linear", (t(10, 8), t(2, 4, 8), ms(11, 0)), {}, "max(values(m_splits)) <= M"),
    "gl_wrong_G": ("grouped_linear", (t(10, 8), t(2, 4, 8), ms(3, 3, 4)), {}, "m_splits"),
    "gl_m_splits_int32": ("grouped_linear", (t(10, 8), t(2, 4, 8), ms(3, 7, dtype=torch.int32)), {}, "m_splits"),
    "gl_weight_dtype": ("grouped_linear", (t(10, 8, dtype=bf), t(2, 4, 8), ms(3, 7)), {}, "weight"),
    "gl_weight_K": ("grouped_linear", (t(10, 8), t(2, 4, 9), ms(3, 7)), {}, "weight"),
    "gl_noncontig": ("grouped_linear", (t(8, 10).t(), t(2, 4, 8), ms(3, 7)), {}, "contiguous"),
    "gl_precision": ("grouped_linear", (t(10, 8), t(2, 4, 8), ms(3, 7)), {"precision": "fp8"}, "precision"),
    "gl_mx_K32": ("grouped_linear", (t(64, 48), t(2, 32, 48), ms(32, 32)), {"precision": "mxfp8"}, "K % 32"),
    "gl_mx_grad_N32": ("grouped_linear", (t(64, 32, grad=True), t(2, 48, 32, grad=True), ms(32, 32)),
                       {"precision": "mxfp8"}, "N % 32"),
    "gl_mx_grad_splits32": ("grouped_linear", (t(64, 32, grad=True), t(2, 32, 32, grad=True), ms(40, 24)),
                            {"precision": "mxfp8"}, "all_div(values(m_splits), 32)"),
    "gl_mx_wgrad_only_splits32": ("grouped_linear", (t(64, 32), t(2, 32, 32, grad=True), ms(40, 24)),
                                  {"precision": "mxfp8"}, "all_div"),
    "sw_odd_width": ("scaled_swiglu", (t(4, 7), t(4)), {}, "F2"),
    "sw_interleave": ("scaled_swiglu", (t(4, 96), t(4)), {"glu_interleave_size": 32}, "F2 % (2 * glu_interleave_size)"),
    "sw_interleave_min": ("scaled_swiglu", (t(4, 64), t(4)), {"glu_interleave_size": 0}, "glu_interleave_size"),
    "sw_probs_f64": ("scaled_swiglu", (t(4, 64, dtype=bf), t(4, dtype=torch.float64)), {}, "probs"),
    "sw_h_f64_probs_f32": ("scaled_swiglu", (t(4, 64, dtype=torch.float64), t(4)), {}, "probs"),
    "sw_probs_bf16": ("scaled_swiglu", (t(4, 64, dtype=bf), t(4, dtype=bf)), {}, "probs"),
    "sw_probs_shape": ("scaled_swiglu", (t(4, 64), t(5)), {}, "probs"),
    "mlp_H256": ("grouped_mlp_mxfp8", *mlp(H=128), "H % 256"),
    "mlp_F256": ("grouped_mlp_mxfp8", *mlp(F=128), "F % 256"),
    "mlp_F256_quant_off": ("grouped_mlp_mxfp8", *mlp(F=128, quantize=False), "F % 256"),
    "mlp_splits32_grad": ("grouped_mlp_mxfp8", *mlp(splits=(40, 24), grad=True), "all_div"),
    "mlp_sum": ("grouped_mlp_mxfp8", *mlp(splits=(32, 16)), "sum(values(m_splits)) == M"),
    "mlp_negative": ("grouped_mlp_mxfp8", *mlp(splits=(96, -32)), "min(values(m_splits)) >= 0"),
    "mlp_above_M": ("grouped_mlp_mxfp8", *mlp(splits=(96, 0)), "max(values(m_splits)) <= M"),
    "mlp_wrong_G": ("grouped_mlp_mxfp8", *mlp(splits=(32, 32, 0)), "(G) = 3"),
    "mlp_x_fp32": ("grouped_mlp_mxfp8", *mlp(dtype=torch.float32), "tensor x"),
    "mlp_probs_f64": ("grouped_mlp_mxfp8", *mlp(probs_dtype=torch.float64), "probs"),
    "mlp_x_f64_probs_f32": ("grouped_mlp_mxfp8", *mlp(dtype=torch.float64), "probs"),
    "mlp_quantize_type": ("grouped_mlp_mxfp8", *mlp(quantize="yes"), "quantize"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_refused_with_op_name(name):
    op, args, kwargs, needle = CASES[name]
    with pytest.raises(SpecError) as e:
        registry.get(op)(*args, **kwargs)
    msg = str(e.value)
    assert msg.startswith(op + ":"), msg
    assert needle in msg, msg


@pytest.mark.parametrize("op", ["grouped_linear", "grouped_mlp_mxfp8"])
def test_shapes_whose_m_splits_sum_could_wrap_are_refused(op):
    """G M >= 2**63: m_splits' entries in [0, M] could then add up past int64, where a CUDA m_splits' sum rule
    (a tensor sum) wraps. Only shape propagation (FakeTensorMode) can build such inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    G, M = 2**24, 2**40
    with FakeTensorMode():
        args = ((torch.empty(M, 256), torch.empty(G, 32, 256), torch.empty(G, dtype=torch.int64))
                if op == "grouped_linear" else
                (torch.empty(M, 256, dtype=bf), torch.empty(M), torch.empty(G, dtype=torch.int64),
                 torch.empty(G, 512, 256, dtype=bf), torch.empty(G, 256, 256, dtype=bf)))
        with pytest.raises(SpecError, match=rf"^{op}: constraint 'G \* M < 2\*\*63'"):
            registry.get(op)(*args)


def test_mlp_fc1_not_2F():
    x, p, s, w1, w2 = mlp()[0]
    with pytest.raises(SpecError, match="grouped_mlp_mxfp8: tensor fc1_weight"):
        registry.get("grouped_mlp_mxfp8")(x, p, s, w1[:, :384], w2)


def test_device_mismatch_refused():
    x = torch.empty(64, 32, device="meta")
    with pytest.raises(SpecError, match="grouped_linear: tensor weight"):
        registry.get("grouped_linear")(x, t(2, 32, 32), ms(32, 32))


def test_conditional_rules_stay_quiet_outside_their_condition():
    """m_splits % 32 and N % 32 only bind MXFP8 with gradients; m_splits may live on another device."""
    gl = registry.get("grouped_linear")
    gl(t(64, 32), t(2, 48, 32), ms(40, 24), precision="mxfp8")              # no grad
    gl(t(64, 32, grad=True), t(2, 48, 32, grad=True), ms(40, 24))           # bf16 path
    with torch.no_grad():
        gl(t(64, 32, grad=True), t(2, 48, 32, grad=True), ms(40, 24), precision="mxfp8")
    x, p, s, w1, w2 = mlp(splits=(40, 24), grad=True)[0]
    registry.get("grouped_mlp_mxfp8")(x, p, s, w1, w2, quantize=False).sum().backward()
    registry.get("mxfp8_quantize")(t(48, 32), axis="rowwise")
    registry.get("mxfp8_quantize")(t(32, 48), axis="columnwise")
    bound = gl.bind(torch.empty(64, 32, device="meta"), torch.empty(2, 48, 32, device="meta"), ms(40, 24))
    assert bound.device.type == "meta"                                     # m_splits stays on the host


@pytest.mark.parametrize("op_name", ["grouped_linear", "grouped_mlp_mxfp8"])
def test_m_splits_as_a_list_of_ints(op_name):
    """m_splits may come as a Python list or tuple of ints (Transformer Engine's GroupedLinear takes
    List[int]; DeepEP returns the per-expert counts as one), positional or keyword: the results equal
    the int64-tensor call's bitwise, and its rules still apply to the values. Floats or
    bools in it are refused, naming op and tensor; other types reach the tensor check."""
    op = registry.get(op_name)
    M, H, F, G = 64, 256, 256, 2
    x = t(M, H, dtype=bf)
    if op_name == "grouped_linear":
        w = t(G, 128, H, dtype=bf)
        call = lambda s, **k: op(x, w, s, **k) if s is not None else op(x, w, **k)  # noqa: E731
    else:
        p, w1, w2 = t(M), t(G, 2 * F, H, dtype=bf), t(G, H, F, dtype=bf)
        call = lambda s, **k: op(x, p, s, w1, w2, **k) if s is not None else op(x, p, w1, w2, **k)  # noqa: E731
    want = call(ms(32, 32))
    for splits in ([32, 32], (32, 32)):
        assert torch.equal(call(splits), want)
    if op_name == "grouped_linear":
        assert torch.equal(op(x, w, m_splits=[32, 32]), want)
    with pytest.raises(SpecError, match=rf"{op_name}: constraint 'sum\(values\(m_splits\)\) == M'"):
        call([32, 16])
    for bad in ([32.0, 32], [True, 32]):
        with pytest.raises(SpecError, match=rf"{op_name}: tensor m_splits: expected a torch.Tensor or a sequence of ints"):
            call(bad)
    with pytest.raises(SpecError, match=rf"{op_name}: tensor m_splits: expected a torch.Tensor, got dict"):
        call({0: 32, 1: 32})
    with pytest.raises(SpecError, match=rf"{op_name}: tensor m_splits: expected ints that fit torch.int64"):
        call([2 ** 63, 0])
    np = pytest.importorskip("numpy")
    assert torch.equal(call([np.int64(32), np.int32(32)]), want)  # numpy ints (__index__) count as ints
