"""cuTile gdn_decode (tilekernels/gdn/cutile_decode.py).

CPU (CI): every variant compiles to a cubin for sm_90 and sm_100 through the same launch
builder the GPU path uses (``meta`` tensors, ``export_cubin``); the launch config is the
compile key (built from Hk, Hv, dk, dv, W and the state's element size, never from B or N);
the split of a key head's state tiles over blocks follows B through the grid only.

GPU (marked ``gpu``, skipped without CUDA): against ``reference.decode`` run in float64 on
upcasts of the same inputs, o NaN-poisoned first, fresh random inputs each run (conftest).
Tolerances (tilekernels.testing, by the dtype of the checked output):
  o bf16 1e-2: one bf16 rounding of o (2^-9 per element) on top of fp32 arithmetic;
  ssm_state fp32 1e-5: the kernel does the reference's math in fp32 from the same inputs
    (fp32 reassociation ~ sqrt(dk) * 2^-24; the tensor-core reductions (MM) see S and k, q
    to ~22 significant bits (two tf32 parts each, products exact, fp32 accumulation): ~2^-21
    relative on S^T k; the fast silu (FAST) a few ulp; FUSE's k.q as the raw dot times both
    norms' rsqrt, a few ulp from the normalized dot: all orders of magnitude below);
  ssm_state bf16 1e-2: one bf16 rounding of the updated state per step (MM: the bf16 state
    is exact on the tensor cores, k and q in two bf16 parts: ~2^-17 relative on S^T k);
  conv_state exact: it is a copy of inputs (shift + append), no arithmetic.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

try:
    import cuda.tile as ct  # noqa: F401
except ImportError:  # importable without cuTile: test_gdn_cute_decode.py (the CuTe DSL bundle has no
    ct = None        # cuTile) runs this module's cases and GPU tests on its own kernel
cd = None
if ct is not None:
    from tilekernels.gdn import cutile_decode as cd  # noqa: E402
pytestmark = pytest.mark.skipif(ct is None, reason="could not import 'cuda.tile'")

from specs.schema import EPS_MIN  # noqa: E402
from tilekernels.gdn import bench as mk  # noqa: E402
from tilekernels.gdn import reference as ref  # noqa: E402
from tilekernels.testing import assert_close, assert_cubins, misaligned_copy  # noqa: E402

BF, F32, F64 = torch.bfloat16, torch.float32, torch.float64
ARCHS = ("sm_90", "sm_100")
QWEN = dict(Hk=16, Hv=32, dk=128, dv=128, W=4)

# (shape, state dtype, with state_indices, mixed dtype): Qwen3-Next in every state/indices
# variant; Hv/Hk in {1, 2, 4}, dk != dv, W in {2, 3, 4}, non-power-of-two dk and dv
COMPILE_VARIANTS = [
    (QWEN, F32, True, BF), (QWEN, BF, True, BF), (QWEN, F32, False, BF),
    (dict(Hk=2, Hv=4, dk=64, dv=32, W=3), F32, True, BF),
    (dict(Hk=4, Hv=4, dk=32, dv=64, W=2), BF, False, BF),
    (dict(Hk=1, Hv=4, dk=48, dv=40, W=4), F32, True, F32),
]


def _vid(v):
    s, sd, idx, dt = v
    return "Hk{Hk}-Hv{Hv}-dk{dk}-dv{dv}-W{W}".format(**s) + \
        f"-{str(sd)[6:]}state-{'idx' if idx else 'noidx'}-{str(dt)[6:]}"


def _launch(v, B=8, N=16, cfg=None, split=None):
    s, sd, idx, dt = v
    return cd.representative_launches(**s, B=B, N=N, dtype=dt, state_dtype=sd, with_indices=idx,
                                      cfg=cfg, split=split)["gdn_decode.fwd"][0]


# ------------------------------------------------------------------ CPU (CI)


def test_every_variant_compiles_for_sm90_and_sm100():
    """Every compiled kernel: gdn_decode_fwd at B=8 (split > 1 at Qwen3-Next shapes) and the
    split-1 launch where it differs: gdn_decode_whole (STATIC: bf16 state), and gdn_decode_fwd
    with PF (the PF1 variant, fp32 state) for the Qwen3-Next and the odd fp32 shape."""
    jobs = [(_vid(v), _launch(v), arch) for v in COMPILE_VARIANTS for arch in ARCHS]
    whole = [(_vid(v) + "-whole", _launch(v, split=1), arch) for v in COMPILE_VARIANTS if _launch(v).cfg.STATIC
             for arch in ARCHS]
    assert whole and all(j[1].kernel is cd.gdn_decode_whole for j in whole)
    pf = [(_vid(v) + "-pf", _launch(v, cfg=dataclasses.replace(_launch(v).cfg, PF1=True), split=1), arch)
          for v in (COMPILE_VARIANTS[0], COMPILE_VARIANTS[5]) for arch in ARCHS]
    assert all(j[1].cfg.PF1 and _pf(j[1]) and not _pf(_launch(COMPILE_VARIANTS[0])) for j in pf)
    assert_cubins(jobs + whole + pf)


def _pf(ln):
    """The PF constant a launch passes (PF1 turns it on where the split is 1)."""
    return ln.args[26]


def test_launch_config_is_the_compile_key():
    """The config comes from (Hk, Hv, dk, dv, W, state element size); B and N are dynamic
    shapes: the grid (B, Hk * split) follows B, and at split 1 STATIC (bf16 state) runs
    gdn_decode_whole (PF1, a variant, gdn_decode_fwd with PF): two compiled kernels at most, one
    for split > 1 and one for split 1, neither keyed on B."""
    v = COMPILE_VARIANTS[0]
    small, big = _launch(v, B=1, N=1), _launch(v, B=256, N=4096)
    assert small.cfg == big.cfg and small.key() == _launch(v, B=2, N=7).key()
    assert big.key() == _launch(v, B=64, N=64).key() == small.key() and not _pf(big) and not _pf(small)
    pf1 = dataclasses.replace(small.cfg, PF1=True)
    assert _pf(_launch(v, B=256, N=256, cfg=pf1)) and not _pf(_launch(v, B=1, N=1, cfg=pf1))
    cfg = cd.DecodeCfg.heuristic(16, 32, 128, 128, 4)
    assert small.grid == (1, 16 * cfg.split(1, 132), 1) and big.grid == (256, 16 * cfg.split(256, 132), 1)
    assert cfg is cd.DecodeCfg.heuristic(16, 32, 128, 128, 4)  # cached, hashable
    assert (cfg.Hk, cfg.R, cfg.W, cfg.DK, cfg.BV * cfg.NV) == (16, 2, 4, 128, 128) and cfg.FAST and not cfg.MM
    vb = COMPILE_VARIANTS[1]  # bf16 state: STATIC
    one, many, more = _launch(vb, B=1, N=1), _launch(vb, B=256, N=256), _launch(vb, B=64, N=4096)
    assert one.kernel is cd.gdn_decode_fwd and many.kernel is more.kernel is cd.gdn_decode_whole
    assert many.key() == more.key() and many.grid == (256, 16, 1) and one.grid[1] > 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.BV = 32
    # each compile-time choice is in the key: state dtype, indices, shape, config
    keys = {_launch(v).key() for v in COMPILE_VARIANTS}
    assert len(keys) == len(COMPILE_VARIANTS)
    assert _launch(v, cfg=cfg.with_tile(128, 64 if cfg.BV != 64 else 32)).key() != small.key()
    odd = cd.DecodeCfg.heuristic(1, 4, 48, 40, 4)
    assert odd.DK == 64 and odd.BV * odd.NV >= 40 and odd.WP == 4 and odd.WW == 4


def test_split_follows_the_batch_not_the_key():
    """Blocks per (row, key head): all G = R*NV tiles split while B*Hk*split stays within
    about BLOCKS_PER_SM blocks per SM; one block per key head for large batches; always a
    power of two dividing G; the compile key is the same for every split."""
    cfg = cd.DecodeCfg.heuristic(16, 32, 128, 128, 4)
    G = cfg.R * cfg.NV
    splits = {B: cfg.split(B, 132) for B in (1, 2, 4, 8, 32, 256, 4096)}
    assert splits[1] == G and splits[256] == splits[4096] == 1
    assert all(G % ns == 0 and ns & (ns - 1) == 0 for ns in splits.values())
    assert all(B * 16 * ns <= cd.BLOCKS_PER_SM * 132 or ns == 1 for B, ns in splits.items())
    assert list(splits.values()) == sorted(splits.values(), reverse=True)
    v = COMPILE_VARIANTS[0]
    keys = {cd.representative_launches(B=B, N=8)["gdn_decode.fwd"][0].key() for B in (1, 8, 256)}
    assert len(keys) == 1 and _launch(v, B=1).key() in keys  # fp32 state: one kernel at every split
    with pytest.raises(ValueError, match="split 3"):
        _launch(v, cfg=cfg, split=3)


def test_every_dv_tiling_compiles():
    """dv tiles beside the heuristic's 32 (fp32) and 64 (bf16): BV = 16 and 128 (NV = 8 and 1
    per value head), and a shape with G = R*NV = 1 tile per key head (split always 1), compile
    for both archs."""
    v = COMPILE_VARIANTS[0]
    base = cd.DecodeCfg.heuristic(16, 32, 128, 128, 4)
    jobs = [(f"BV{bv}", _launch(v, cfg=base.with_tile(128, bv)), arch) for bv in (16, 128) for arch in ARCHS]
    one = (dict(Hk=4, Hv=4, dk=32, dv=32, W=2), F32, True, BF)  # R = 1, NV = 1: G = 1
    jobs += [("G1", _launch(one), arch) for arch in ARCHS]
    assert _launch(one).cfg.NV * _launch(one).cfg.R == 1
    assert_cubins(jobs)


# kernel variants beside the heuristic's (sweeps, and what the default was before): tensor-core
# reductions, the exact silu, the next tile's inputs loaded before this tile's math (PF) at
# every split or at split 1 (PF1), plain or TMA state moves, either kernel at split 1, the fused
# q|k prologue (FUSE), the (b, kh) counter taken before the tiles (EARLY), state stores from
# registers with TMA loads (STMA0)
KERNEL_VARIANTS = {"MM": dict(MM=True), "FAST0": dict(FAST=False), "PF": dict(PF=True), "PF1": dict(PF1=True),
                   "noTMA": dict(TMA=False), "TMA": dict(TMA=True), "STATIC1": dict(STATIC=True),
                   "STATIC0": dict(STATIC=False), "FUSE": dict(FUSE=True), "EARLY": dict(EARLY=True),
                   "STMA0": dict(STMA=False)}


def test_kernel_variants_compile():
    """Every kernel variant of KERNEL_VARIANTS compiles for both archs, fp32 and bf16 state
    (at split 1 where STATIC or PF1 makes it another kernel; a variant equal to the default is
    skipped)."""
    jobs = []
    for v in COMPILE_VARIANTS[:2]:
        base = _launch(v).cfg
        for name, ch in KERNEL_VARIANTS.items():
            cfg = dataclasses.replace(base, **ch)
            if cfg != base:
                jobs += [(f"{name}-{str(v[1])[6:]}", _launch(v, cfg=cfg, split=1 if cfg.STATIC or cfg.PF1 else None),
                          a) for a in ARCHS]
    assert_cubins(jobs)


def test_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="W=1"):
        cd.DecodeCfg.heuristic(16, 32, 128, 128, 1)
    v = COMPILE_VARIANTS[0]
    with pytest.raises(ValueError, match="does not fit"):
        _launch(v, cfg=cd.DecodeCfg.heuristic(16, 32, 64, 128, 4))  # dk 128 > DK 64
    cfg = cd.DecodeCfg.heuristic(16, 32, 128, 128, 4)
    with pytest.raises(ValueError, match="does not fit"):
        _launch(v, cfg=cfg.with_tile(128, 4, MM=True))  # mma needs BV >= 8
    with pytest.raises(ValueError, match="does not fit"):
        _launch(v, cfg=dataclasses.replace(cfg, MM=True, FUSE=True))  # the fused prologue has no mma rows
    tiny = cd.DecodeCfg.heuristic(4, 4, 8, 4, 2)
    assert not tiny.MM and tiny.BV == 4  # no mma shape fits: CUDA-core reductions
    # settings that computed wrong results on the H200 (cutile_decode's "Known faults") are refused
    with pytest.raises(ValueError, match="PF at occupancy"):
        dataclasses.replace(cfg, PF1=True, OCC=4)
    with pytest.raises(ValueError, match="BV >= 128 or with MM"):
        cfg.with_tile(128, 128, PF1=True)
    with pytest.raises(ValueError, match="BV >= 128 or with MM"):
        dataclasses.replace(cfg, PF=True, MM=True)
    with pytest.raises(ValueError, match="TMA off"):
        cfg.with_tile(128, 8, TMA=False, OCC=2)
    assert dataclasses.replace(cfg, OCC=4).OCC == 4 and not cfg.PF1  # occupancy 4 without PF: correct
    assert cfg.with_tile(128, 8, TMA=False, OCC=3).BV == 8
    # TMA tiles of <= 32 rows of <= 128 bytes hung on the H200 (cutile_decode.hang_risk): the
    # heuristic turns TMA off there, and a launch with it on is refused before it can hang
    small = cd.DecodeCfg.heuristic(2, 4, 32, 32, 4)
    assert not small.TMA and cd.DecodeCfg.heuristic(2, 4, 32, 64, 4).TMA  # fp32 [32, 64]: 256-byte rows
    assert not cd.DecodeCfg.heuristic(4, 4, 32, 64, 2, state_bytes=2).TMA  # bf16 [32, 64]: 128-byte rows
    with pytest.raises(ValueError, match="hung on the H200"):
        _launch((dict(Hk=2, Hv=4, dk=32, dv=32, W=4), F32, True, BF), cfg=dataclasses.replace(small, TMA=True))


@pytest.mark.parametrize("which", ["mixed", "conv_state", "conv_weight", "A_log", "dt_bias", "ssm_state",
                                   "state_indices", "o"])
def test_misaligned_tensors_reach_the_kernel_aligned(which, monkeypatch):
    """decode_into hands decode_launch only 16-byte aligned tensors (a misaligned fp32-state call had not
    finished on the GPU: decode_into's docstring), and what the launch writes into its aligned copies of
    conv_state, ssm_state and o reaches the caller's tensors; inputs are left as they were. A stand-in
    launch (CPU) writes known values: every element of the three written tensors is checked."""
    names = ["mixed", "conv_state", "conv_weight", "A_log", "dt_bias", "ssm_state", "state_indices", "o"]
    d = dict(Hk=2, Hv=4, dk=8, dv=8, W=3, B=3, N=5)
    args, params = mk.cases("cpu")[2].make(d, torch.device("cpu"))
    args = list(args) + [torch.full((d["B"], d["Hv"], d["dv"]), float("nan"), dtype=args[0].dtype)]
    i = names.index(which)
    args[i] = misaligned_copy(args[i])
    assert args[i].data_ptr() % 16
    before = [a.clone() for a in args]
    seen = []

    class _Run:
        def __init__(self, ts):
            self.ts = ts

        def run(self):
            _, conv, _, _, _, ssm, _, o = self.ts
            conv.add_(1)
            ssm.mul_(-2)
            o.copy_(torch.arange(o.numel(), dtype=o.dtype).view(o.shape))

    def fake(*a):
        seen.append([t.data_ptr() % 16 for t in a[:8]])
        return _Run(a[:8])

    monkeypatch.setattr(cd, "decode_launch", fake)
    cd.decode_into(*args, params["Hk"], 1e-6, None)
    assert seen == [[0] * 8]
    for j, (a, b) in enumerate(zip(args, before)):
        want = {1: b + 1, 5: b * -2, 7: torch.arange(b.numel(), dtype=b.dtype).view(b.shape)}.get(j, b)
        assert torch.equal(a, want), names[j]
    seen.clear()
    cd.decode_into(*[a[:0] if j in (0, 6, 7) else a for j, a in enumerate(args)], params["Hk"], 1e-6, None)
    assert seen == []  # an empty batch launches nothing


# ------------------------------------------------------------------ GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _inputs(B, N, Hk, Hv, dk, dv, W, dtype=BF, state_dtype=F32):
    w, A, dt = mk.weights(Hk, Hv, dk, dv, W, dtype=dtype, device="cuda")
    conv, ssm = mk.decode_states(N, Hk, Hv, dk, dv, W, dtype=dtype, state_dtype=state_dtype, device="cuda")
    return mk.mixed((B,), Hk, Hv, dk, dv, dtype=dtype, device="cuda"), conv, w, A, dt, ssm


def _indices(B, N, mode):
    """None, or [B] int32: a random permutation of distinct slots with every third row -1."""
    if mode is None:
        return None
    idx = torch.randperm(N)[:B].to(torch.int32)
    if mode == "pad":
        idx[::3] = -1
    return idx.cuda()


def _run(x, conv, w, A, dt, ssm, idx, Hk, scale=None, eps=1e-6):
    B, Hv, dv = x.shape[0], A.shape[0], ssm.shape[3]
    o = torch.full((B, Hv, dv), float("nan"), dtype=x.dtype, device=x.device)
    cd.decode_into(x, conv, w, A, dt, ssm, idx, o, Hk, eps, scale)
    return o


def _ref64(x, conv, w, A, dt, ssm, idx, Hk, scale=None):
    """reference.decode in float64 on copies; returns (o, conv_state, ssm_state) in float64."""
    c64, s64 = conv.double(), ssm.double()
    o = ref.decode(x.double(), c64, w.double(), A.double(), dt.double(), s64, idx, Hk=Hk, scale=scale)
    return o, c64, s64


GPU_CASES = [
    # (B, N, shape, state dtype, indices mode)
    (1, 4, QWEN, F32, None),
    (33, 40, QWEN, F32, "pad"),
    (5, 9, QWEN, BF, "perm"),
    (33, 33, QWEN, BF, None),
    (5, 8, dict(Hk=2, Hv=4, dk=64, dv=32, W=3), F32, "pad"),
    (33, 50, dict(Hk=4, Hv=4, dk=32, dv=64, W=2), BF, "pad"),
    (5, 5, dict(Hk=1, Hv=4, dk=48, dv=40, W=4), F32, None),
    (1, 3, dict(Hk=1, Hv=4, dk=48, dv=40, W=4), F32, "pad"),  # B=1, its only row padded
    # tk-bench's small case: [32, 32] fp32 tiles hung with TMA (hang_risk), split 2 at B=8
    (8, 16, dict(Hk=2, Hv=4, dk=32, dv=32, W=4), F32, "perm"),
    (8, 16, dict(Hk=2, Hv=4, dk=32, dv=32, W=4), BF, "perm"),
]


def case_id(c) -> str:
    """Test id of a (B, N, shape, state dtype, indices mode) case."""
    return f"B{c[0]}-N{c[1]}-" + "Hk{Hk}-Hv{Hv}-dk{dk}-dv{dv}-W{W}".format(**c[2]) + f"-{str(c[3])[6:]}-{c[4]}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("B,N,shape,sd,mode", GPU_CASES, ids=[case_id(c) for c in GPU_CASES])
def test_decode_matches_float64_reference(B, N, shape, sd, mode):
    x, conv, w, A, dt, ssm = _inputs(B, N, **shape, state_dtype=sd)
    o = torch.full((B, shape["Hv"], shape["dv"]), float("nan"), dtype=x.dtype, device=x.device)
    _check_step([x, conv, w, A, dt, ssm, _indices(B, N, mode), o], shape["Hk"], sd)


def _check_step(args, Hk, sd):
    """One decode_into call on args = [mixed, conv_state, conv_weight, A_log, dt_bias, ssm_state,
    state_indices, o] (o NaN-poisoned) against the float64 reference: o, ssm_state at their dtypes'
    tolerances, conv_state exact; slots no real row names bit-identical; padded rows of o zero."""
    x, conv, w, A, dt, ssm, idx, o = args
    conv0, ssm0 = conv.clone(), ssm.clone()
    o64, c64, s64 = _ref64(x, conv, w, A, dt, ssm, idx, Hk)
    cd.decode_into(x, conv, w, A, dt, ssm, idx, o, Hk, 1e-6, None)
    assert_close(o, o64, what="o")
    assert_close(ssm, s64, kind=sd, what="ssm_state")
    assert_close(conv, c64.to(conv.dtype), kind="exact", what="conv_state")
    slots = torch.arange(x.shape[0]) if idx is None else idx.cpu().long()
    named = set(slots[slots >= 0].tolist())
    other = [s for s in range(ssm.shape[0]) if s not in named]
    assert torch.equal(ssm[other], ssm0[other]) and torch.equal(conv[other], conv0[other]), "unnamed slot touched"
    if idx is not None:
        pad = (idx < 0).nonzero().flatten()
        assert torch.equal(o[pad], torch.zeros_like(o[pad])), "padded rows must be zero"


MISALIGNABLE = ["mixed", "conv_state", "conv_weight", "A_log", "dt_bias", "ssm_state", "state_indices", "o"]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
@pytest.mark.parametrize("which", MISALIGNABLE)
def test_misaligned_input_matches_reference(which, sd):
    """One tensor passed one element off its allocation's start (not 16-byte aligned), Qwen3-Next heads,
    padded state_indices: decode_into runs the kernel on aligned copies (the misaligned fp32-state
    specialization had not finished on an H100, session 52), so the call finishes and equals the float64
    reference, and what the kernel wrote reaches the caller's conv_state, ssm_state and o; slots no row
    names stay bit-identical. Small enough (B=5, N=9) for the sanitizers."""
    B, N = 5, 9
    x, conv, w, A, dt, ssm = _inputs(B, N, **QWEN, state_dtype=sd)
    args = [x, conv, w, A, dt, ssm, _indices(B, N, "pad"), torch.full((B, 32, 128), float("nan"), dtype=BF,
                                                                      device="cuda")]
    i = MISALIGNABLE.index(which)
    args[i] = misaligned_copy(args[i])
    assert args[i].data_ptr() % 16
    _check_step(args, QWEN["Hk"], sd)


def _recurrence(q, k, v, g, beta, scale):
    """Plain gated delta rule over T (float64), all rows and value heads at once; q, k already
    repeated to Hv heads. q, k [B, T, Hv, dk]; v [B, T, Hv, dv]; g, beta [B, T, Hv].
    Returns (o [B, T, Hv, dv], the state after every step: list of [B, Hv, dk, dv])."""
    B, T, Hv, dk = k.shape
    S = torch.zeros(B, Hv, dk, v.shape[-1], dtype=F64, device=k.device)
    outs, states = [], []
    for t in range(T):
        S = S * torch.exp(g[:, t])[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, scale * q[:, t]))
        states.append(S)
    return torch.stack(outs, 1), states


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
@pytest.mark.parametrize("T0", [1, 6])
def test_steps_continue_a_prefill(sd, T0):
    """k decode steps from a prefill (gdn_pre_gated's final conv state, the float64
    recurrence's state) equal the reference over the concatenated tokens."""
    Hk, Hv, dk, dv, W, steps, B, N = 2, 4, 64, 32, 4, 4, 5, 9
    scale = 0.3
    w, A, dt = mk.weights(Hk, Hv, dk, dv, W, device="cuda")
    full = mk.mixed((B, T0 + steps), Hk, Hv, dk, dv, device="cuda")
    q, k, v, _, g, beta = ref.pre_gated(full.double(), w.double(), A.double(), dt.double(), Hk=Hk, dk=dk,
                                        dv=dv, repeat_qk=True)
    o_all, states = _recurrence(q, k, v, g, beta, scale)
    conv_pre = ref.pre_gated(full[:, :T0], w, A, dt, Hk=Hk, dk=dk, dv=dv, return_conv_state=True)[-1]
    conv_end = ref.pre_gated(full, w, A, dt, Hk=Hk, dk=dk, dv=dv, return_conv_state=True)[-1]

    conv, ssm = mk.decode_states(N, Hk, Hv, dk, dv, W, state_dtype=sd, device="cuda")
    idx = torch.randperm(N)[:B].to(torch.int32).cuda()
    conv[idx.long()] = conv_pre
    ssm[idx.long()] = states[T0 - 1].to(sd)
    for j in range(steps):
        o = _run(full[:, T0 + j].contiguous(), conv, w, A, dt, ssm, idx, Hk, scale=scale)
        assert_close(o, o_all[:, T0 + j], what=f"o of step {j}")
    assert_close(conv[idx.long()], conv_end, kind="exact", what="conv_state")
    assert_close(ssm[idx.long()], states[-1], kind=sd, what="ssm_state")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("with_idx", [True, False], ids=["idx", "noidx"])
def test_cuda_graph_replay_equals_eager(with_idx):
    B, N = 6, 8
    x, conv, w, A, dt, ssm = _inputs(B, N, **QWEN)
    idx = _indices(B, N, "pad") if with_idx else None
    xs = [mk.mixed((B,), 16, 32, 128, 128, device="cuda") for _ in range(3)]
    # eager, three steps
    ce, se = conv.clone(), ssm.clone()
    eager = [_run(xi, ce, w, A, dt, se, idx, 16).clone() for xi in xs]
    # warm-up (compiles) on throwaway copies, then capture one step and replay it three times
    _run(xs[0], conv.clone(), w, A, dt, ssm.clone(), idx, 16)
    torch.cuda.synchronize()
    cg, sg = conv.clone(), ssm.clone()
    x_static = xs[0].clone()
    o_static = torch.full((B, 32, 128), float("nan"), dtype=BF, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cd.decode_into(x_static, cg, w, A, dt, sg, idx, o_static, 16, 1e-6, None)
    assert torch.equal(cg, conv) and torch.equal(sg, ssm), "capture must not run the kernel"
    for xi, want in zip(xs, eager):
        x_static.copy_(xi)
        graph.replay()
        assert_close(o_static, want, kind="exact", what="o")
    torch.cuda.synchronize()
    assert torch.equal(cg, ce) and torch.equal(sg, se), "replayed states differ from eager"


def _check_splits(cfg, sd, B, N):
    """cfg at Qwen3-Next shapes, splits 1, 2 and G (G = R*NV tiles a key head), padded
    state_indices: same results as the float64 reference, the window shifted exactly once
    (conv_state exact), the grid (B, Hk * split) and the (b, kh) counters back to zero."""
    for ns in sorted({1, 2, cfg.R * cfg.NV}):
        x, conv, w, A, dt, ssm = _inputs(B, N, **QWEN, state_dtype=sd)
        idx = _indices(B, N, "pad")
        o64, c64, s64 = _ref64(x, conv, w, A, dt, ssm, idx, 16)
        o = torch.full((B, 32, 128), float("nan"), dtype=x.dtype, device=x.device)
        ln = cd.decode_launch(x, conv, w, A, dt, ssm, idx, o, 16, 1e-6, None, cfg=cfg, split=ns)
        assert ln.grid == (B, 16 * ns, 1)
        ln.run()
        assert_close(o, o64, what=f"o (split {ns})")
        assert_close(ssm, s64, kind=sd, what=f"ssm_state (split {ns})")
        assert_close(conv, c64.to(conv.dtype), kind="exact", what=f"conv_state (split {ns})")
        assert int(ln.args[12].abs().sum()) == 0, "counters must return to zero"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("BV", [8, 16, 32, 128])
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
def test_every_tiling_and_split_matches_reference(BV, sd):
    """dv tiles BV = 8, 16, 32, 128 (NV = 16, 8, 4, 1 per value head: G = 32, 16, 8, 2 tiles a
    key head; BV = 8 is the heuristic's tile at dk = 512) at splits 1, 2 and G (blocks sharing
    a key head's q/k window; the counters' path from 2 on; at split 1 the default's PF loop for
    fp32, gdn_decode_whole for bf16): same results, the window shifted exactly once (conv_state
    exact), and the (b, kh) counters back to zero after each launch."""
    B, N = 7, 11
    cfg = cd.DecodeCfg.heuristic(16, 32, 128, 128, 4, sd.itemsize).with_tile(128, BV)
    _check_splits(cfg, sd, B, N)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
def test_fused_prologue_zero_heads_at_tiny_eps(sd):
    """FUSE's k.q on a zero q head and a zero k head (their window and token all zero) at eps 2**-126 and scale 8:
    rq = rk = 2**63, so rq * rk * scale overflowed fp32 before it met the dot's 0 (NaN in o); taken one factor at a
    time it stays finite, and o matches the float64 reference (0 on that key head's value heads)."""
    B, N, Hk, dk, eps, scale = 3, 5, 16, 128, EPS_MIN, 8.0
    cfg = dataclasses.replace(cd.DecodeCfg.heuristic(16, 32, 128, 128, 4, sd.itemsize), FUSE=True)
    x, conv, w, A, dt, ssm = _inputs(B, N, **QWEN, state_dtype=sd)
    for lo in (0, Hk * dk):   # q head 0, k head 0 (key head 0): token and window
        x[:, lo:lo + dk] = 0
        conv[:, lo:lo + dk] = 0
    c64, s64 = conv.double(), ssm.double()
    o64 = ref.decode(x.double(), c64, w.double(), A.double(), dt.double(), s64, None, Hk=Hk, eps=eps, scale=scale)
    o = torch.full((B, 32, 128), float("nan"), dtype=x.dtype, device=x.device)
    cd.decode_launch(x, conv, w, A, dt, ssm, None, o, Hk, eps, scale, cfg=cfg, split=1).run()
    assert torch.isfinite(o).all(), "o"
    assert_close(o, o64, what="o")
    assert_close(ssm, s64, kind=sd, what="ssm_state")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", list(KERNEL_VARIANTS))
@pytest.mark.parametrize("sd", [F32, BF], ids=["fp32state", "bf16state"])
def test_every_kernel_variant_matches_reference(name, sd):
    """Each variant of KERNEL_VARIANTS at Qwen3-Next shapes, splits 1, 2 and G (G = R*NV tiles
    per key head): with PF a loop of G, G/2 and no later tile; with STATIC split 1 is
    gdn_decode_whole. Same results as the reference, the window shifted exactly once."""
    B, N = 7, 11
    base = cd.DecodeCfg.heuristic(16, 32, 128, 128, 4, sd.itemsize)
    cfg = dataclasses.replace(base, **KERNEL_VARIANTS[name])
    if cfg == base:
        pytest.skip("the default config: covered by the other tests")
    _check_splits(cfg, sd, B, N)
