"""thd_cp_a2a_perm standalone (no processes), and every cp spec rule refused
before any collective (the all_to_all ops with an explicit cp need no group to
be validated): both sides of every equality, each refusal's explanation in words,
the cutile backend's int32 limit as explain reports it (meta tensors). The
collectives themselves: test_cp_a2a.py."""
import pytest
import torch

import registry
from registry import SpecError
from tilekernels.cp import perm
from tilekernels.cp import reference as ref
from tilekernels.testing import assert_close

PERM = registry.get("thd_cp_a2a_perm")
TO_HP = registry.get("thd_cp_to_hp")
TO_CP = registry.get("thd_hp_to_cp")


def random_cu(cp: int, n_short: int = 9, dtype=torch.int32) -> torch.Tensor:
    """Many short sequences (zero-length ones included) and one long one, lengths % 2cp == 0."""
    lens = (2 * cp * torch.randint(0, 4, (n_short,))).tolist()
    lens.insert(int(torch.randint(0, n_short + 1, ())), 2 * cp * int(torch.randint(20, 40, ())))
    return torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(dtype)


def random_sections(cp: int, n: int = 6) -> list[int]:
    return (cp * torch.randint(1, 5, (n,))).tolist()


def _is_perm(p: torch.Tensor) -> bool:
    return torch.equal(torch.sort(p).values, torch.arange(p.numel()))


def test_hand_built_cp2_two_sequences():
    # lengths 4 and 8, cp=2: chunks of 1 and 2 tokens; rank r holds chunks r and 3-r
    cu = torch.tensor([0, 4, 12], dtype=torch.int32)
    out = PERM(cu, cp=2, split_sections=[4, 2])
    rank0 = [0, 3] + [4, 5, 10, 11]   # seq0 chunks 0,3; seq1 chunks 0,3
    rank1 = [1, 2] + [6, 7, 8, 9]     # seq0 chunks 1,2; seq1 chunks 1,2
    expect_perm = torch.tensor(rank0 + rank1)
    expect_inv = torch.empty(12, dtype=torch.int64)
    expect_inv[expect_perm] = torch.arange(12)
    assert_close(out.token_perm, expect_perm, kind="exact", what="token_perm")
    assert_close(out.token_inv, expect_inv, kind="exact", what="token_inv")
    # sections [4, 2]: rank 0 owns cols 0,1 (of q) and 4 (of k); rank 1 owns 2,3 and 5
    assert_close(out.feature_perm, torch.tensor([0, 1, 4, 2, 3, 5]), kind="exact", what="feature_perm")
    assert_close(out.feature_inv, torch.tensor([0, 1, 3, 4, 2, 5]), kind="exact", what="feature_inv")


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
def test_random_maps_are_inverse_permutations_and_match_loop(cp, cu_dtype):
    cu = random_cu(cp, dtype=cu_dtype)
    sections = random_sections(cp)
    out = PERM(cu, cp=cp, split_sections=sections)
    expect = ref.thd_cp_a2a_perm(cu, cp=cp, split_sections=sections)
    for name in out._fields:
        got = getattr(out, name)
        assert got.dtype == torch.int64 and got.device == cu.device
        assert_close(got, getattr(expect, name), kind="exact", what=name)
    t, d = int(cu[-1]), sum(sections)
    for p, inv, n in ((out.token_perm, out.token_inv, t), (out.feature_perm, out.feature_inv, d)):
        assert p.shape == (n,) and _is_perm(p)
        assert torch.equal(p[inv], torch.arange(n)) and torch.equal(inv[p], torch.arange(n))


@pytest.mark.parametrize("cp", [2, 3])
def test_maps_describe_the_zigzag_and_the_sections(cp):
    cu = random_cu(cp)
    sections = random_sections(cp, 4)
    t, d = int(cu[-1]), sum(sections)
    x = torch.randn(t, d)
    m = PERM(cu, cp=cp, split_sections=sections)
    rank_major = torch.cat([ref.zigzag_local(x, cu, cp, r) for r in range(cp)])
    assert_close(x[m.token_perm], rank_major, kind="exact", what="x[token_perm]")
    assert_close(rank_major[m.token_inv], x, kind="exact", what="rank_major[token_inv]")
    owned = [torch.cat([s.chunk(cp, 1)[r] for s in x.split(sections, 1)], 1) for r in range(cp)]
    assert_close(x[:, m.feature_perm], torch.cat(owned, 1), kind="exact", what="x[:, feature_perm]")


@pytest.mark.parametrize("cu", [[0], [0, 0, 0], [0, 2], [0, 0, 2, 2]])
def test_edges_empty_and_single(cu):
    cu = torch.tensor(cu)
    out = PERM(cu, cp=1)
    assert out.feature_perm is None and out.feature_inv is None
    n = int(cu[-1])
    assert torch.equal(out.token_perm, torch.arange(n)) and torch.equal(out.token_inv, torch.arange(n))


@pytest.mark.parametrize("cp", [1, 2, 3])
def test_module_maps_are_int64_at_every_size_including_empty(cp):
    """perm.py's maps, which ops.py's torch backend uses as they are (not through the op's int64 outputs), are int64
    and bitwise the loop reference's at every size: the empty early-outs (no tokens, no sections) allocate their own
    tensors, and an int32 one there would pass every test through the op (it copies into int64 outputs)."""
    for cu in (torch.tensor([0], dtype=torch.int32), torch.tensor([0, 0, 0]), random_cu(cp)):
        for sections in ([], random_sections(cp)):
            want = ref.thd_cp_a2a_perm(cu, cp=cp, split_sections=sections)
            got = perm.a2a_perm(cu, cp, sections)
            for name in got._fields:
                assert_close(getattr(got, name), getattr(want, name), kind="exact", what=f"perm.a2a_perm {name}")
            for maps, want_maps in ((perm.token_perm(cu, cp), want[:2]), (perm.feature_perm(sections, cp), want[2:])):
                for m, w in zip(maps, want_maps):
                    assert_close(m, w, kind="exact", what="perm.py map")


def test_perm_outputs_are_what_the_spec_declares():
    """The op's outputs have the dtypes and shapes its spec declares, and those are OPS.md's: int64 maps of T and D
    entries (a spec declaring int32 index outputs would go unnoticed: nothing else compares the declaration with
    the op)."""
    spec = PERM.spec
    assert [(o.name, o.dtypes, o.shape) for o in spec.outputs] == [
        ("token_perm", ["int64"], ["T"]), ("token_inv", ["int64"], ["T"]),
        ("feature_perm", ["int64"], ["D"]), ("feature_inv", ["int64"], ["D"])]
    for cp in (1, 3):
        cu, sections = random_cu(cp), random_sections(cp)
        out = PERM(cu, cp=cp, split_sections=sections)
        dims = {"T": int(cu[-1]), "D": sum(sections)}
        for o in spec.outputs:
            got = getattr(out, o.name)
            assert str(got.dtype).removeprefix("torch.") in o.dtypes, (o.name, got.dtype)
            assert list(got.shape) == [dims[d] for d in o.shape], (o.name, got.shape)


def test_reference_no_tokens_at_a_huge_cp_and_helper_rank_checked():
    """The loop reference returns at once when no rank holds a token (the spec admits any cp at T = 0: the op did,
    the oracle looped over every rank), and the zigzag_local helper refuses a rank outside [0, cp) rather than
    return another rank's chunks."""
    out = ref.thd_cp_a2a_perm(torch.tensor([0, 0]), cp=2**40)
    assert out.token_perm.shape == (0,) and out.token_inv.shape == (0,)
    x, cu = torch.arange(8.0), torch.tensor([0, 8])
    for rank in (-1, 2):
        with pytest.raises(ValueError, match="zigzag_local: rank"):
            ref.zigzag_local(x, cu, 2, rank)
    assert torch.equal(ref.zigzag_local(x, cu, 2, 1), torch.tensor([2.0, 3.0, 4.0, 5.0]))


# ------------------------------------------------------------------ refusals

CU_BAD_LEN = torch.tensor([0, 8, 14])      # 6 is not a multiple of 2*cp = 4


def _x(rows, cols, dtype=torch.float32):
    return torch.randn(rows, cols).to(dtype)


def _refused(op, *args, match=None, **kw):
    with pytest.raises(SpecError) as e:
        op(*args, **kw)
    assert op.name in str(e.value)
    if match:
        assert match in str(e.value), str(e.value)
    return e.value


@pytest.mark.parametrize("cp", [2, 3])
def test_bad_lengths_refused_by_all_three_ops(cp):
    cu = torch.tensor([0, 2 * cp, 2 * cp + cp])    # second length cp: not % 2cp
    t = int(cu[-1])
    _refused(PERM, cu, cp=cp, match="2*cp")
    _refused(TO_HP, _x(t // cp, 2 * cp), cu, cp=cp, match="2*cp")
    _refused(TO_CP, _x(t, 2), cu, cp=cp, match="2*cp")


def test_sections_not_divisible_by_cp_refused():
    cu = torch.tensor([0, 8])
    _refused(PERM, cu, cp=2, split_sections=[4, 3], match="split_sections")
    _refused(TO_HP, _x(4, 7), cu, cp=2, split_sections=[4, 3], match="split_sections")
    _refused(TO_CP, _x(8, 3), cu, cp=2, split_sections=[3, 3], match="split_sections")


@pytest.mark.parametrize("sections", [[], [0, 4], [-2, 6]])
def test_sections_not_positive_refused(sections):
    cu = torch.tensor([0, 8])
    _refused(PERM, cu, cp=2, split_sections=sections, match="positive")
    _refused(TO_HP, _x(4, 4), cu, cp=2, split_sections=sections, match="positive")
    _refused(TO_CP, _x(8, 2), cu, cp=2, split_sections=sections, match="positive")


def test_sections_not_ints_refused():
    _refused(PERM, torch.tensor([0, 8]), cp=2, split_sections=[2.0, 4.0], match="list of ints")
    _refused(PERM, torch.tensor([0, 8]), cp=2, split_sections=5, match="list of ints")


def test_maps_past_int64_byte_counts_refused():
    """The maps are int64 tensors of T and D entries: a T or D whose byte count is no int64 is refused by name
    (it reached torch's allocator as an overflow naming neither op nor argument)."""
    _refused(PERM, torch.tensor([0, 8, 16]), cp=2, split_sections=[2 ** 62, 2 ** 62], match="sum(split_sections)")
    _refused(PERM, torch.tensor([0, 8, 16]), cp=2, split_sections=[2 ** 59, 2 ** 59], match="< 2**60")
    _refused(PERM, torch.tensor([0, 2 ** 62]), cp=2, match="T = cu_seqlens[-1] < 2**60")
    _refused(PERM, torch.tensor([0, 2 ** 60]), cp=1, total_tokens=2 ** 60, match="< 2**60")


@pytest.mark.parametrize("cu", [[2, 8], [0, 8, 4]])
def test_cu_seqlens_not_offsets_refused(cu):
    cu = torch.tensor(cu)
    _refused(PERM, cu, cp=1, match="cu_seqlens")
    _refused(TO_HP, _x(int(cu.max()), 2), cu, cp=1, match="cu_seqlens")
    _refused(TO_CP, _x(int(cu.max()), 2), cu, cp=1, match="cu_seqlens")


def test_cu_seqlens_dtype_and_rank_refused():
    _refused(PERM, torch.tensor([0.0, 4.0]), cp=1, match="dtype")
    _refused(PERM, torch.tensor([[0, 4]]), cp=1, match="dims")
    _refused(TO_HP, _x(2, 2), torch.tensor([0.0, 4.0]), cp=2, match="dtype")


def test_cp_param_refused():
    _refused(PERM, torch.tensor([0, 4]), match="param cp: expected a int, got nothing")   # required
    _refused(PERM, torch.tensor([0, 4]), cp=0, match=r"param cp: expected >= 1")
    _refused(TO_HP, _x(2, 2), torch.tensor([0, 4]), cp=0, match=r"param cp: expected >= 1")


def test_shape_rules_refused():
    cu = torch.tensor([0, 8, 16])
    _refused(TO_HP, _x(7, 4), cu, cp=2, match="T_global/cp")          # needs 8 local tokens
    _refused(TO_HP, _x(8, 6), cu, cp=2, split_sections=[2, 2], match="sum(split_sections)")
    _refused(TO_HP, _x(8, 5), cu, cp=2, match="D % cp")
    _refused(TO_HP, _x(8, 0), cu, cp=2, match="dim D")
    _refused(TO_CP, _x(15, 2), cu, cp=2, match="T_global")
    _refused(TO_CP, _x(16, 3), cu, cp=2, split_sections=[2, 2], match="sum(split_sections)")


def test_shape_rules_refuse_excess_as_well_as_deficit():
    """Every shape rule is an equality: the surplus side is refused as surely as the deficits of
    test_shape_rules_refused (one local token too many, x narrower than the sections, hp tokens past
    cu_seqlens[-1], hp columns short of 1/cp of the sections, a total_tokens below cu_seqlens[-1])."""
    cu = torch.tensor([0, 8, 16])
    _refused(TO_HP, _x(9, 4), cu, cp=2, match="x_local holds T_global/cp tokens")         # 18 > 16
    _refused(TO_HP, _x(8, 2), cu, cp=2, split_sections=[2, 2], match="the sections tile the feature dim")
    _refused(TO_CP, _x(18, 2), cu, cp=2, match="x holds all T_global tokens")
    _refused(TO_CP, _x(16, 1), cu, cp=2, split_sections=[2, 2], match="x holds 1/cp of every section")
    _refused(PERM, cu, cp=2, total_tokens=12, match="total_tokens is cu_seqlens[-1]")


def test_cu_seqlens_without_entries_refused():
    """cu_seqlens has N + 1 >= 1 entries (N = 0 sequences is [0]): an empty one is refused by name."""
    cu = torch.tensor([], dtype=torch.int32)
    want = "dim N1 (tensor cu_seqlens's dim 0)"
    _refused(PERM, cu, cp=1, match=want)
    _refused(TO_HP, _x(0, 2), cu, cp=2, match=want)
    _refused(TO_CP, _x(0, 1), cu, cp=2, match=want)


# (op, positional args, params, the rule's explanation in words): a refusal says which rule broke in words that
# name the argument, not only its expression (the explanations are what a user reads first)
_EXPLAINED = [
    (PERM, ([2, 8],), dict(cp=1), "(cu_seqlens starts at 0)"),
    (PERM, ([0, 8, 4],), dict(cp=1), "(cu_seqlens is nondecreasing)"),
    (PERM, ([0, 8, 14],), dict(cp=2), "seqlens(cu_seqlens)=(8, 6), cp=2 (every sequence length is a multiple of 2*cp"),
    (PERM, ([0, 8],), dict(cp=2, split_sections=[0, 4]), "(split_sections lists positive widths)"),
    (PERM, ([0, 8],), dict(cp=2, split_sections=[4, 3]), "(every section width is a multiple of cp"),
    (PERM, ([0, 8],), dict(cp=2, total_tokens=4), "(total_tokens is cu_seqlens[-1])"),
    (TO_HP, ((4, 6), [0, 8]), dict(cp=2, split_sections=[2, 2]), "(the sections tile the feature dim)"),
    (TO_HP, ((4, 5), [0, 8]), dict(cp=2), "(each hp rank owns D/cp features)"),
    (TO_CP, ((8, 3), [0, 8]), dict(cp=2, split_sections=[2, 2]), "(x holds 1/cp of every section"),
]


@pytest.mark.parametrize("case", range(len(_EXPLAINED)))
def test_refusals_explain_the_rule_naming_the_argument(case):
    op, args, kw, text = _EXPLAINED[case]
    args = tuple(_x(*a) if isinstance(a, tuple) else torch.tensor(a) for a in args)
    _refused(op, *args, match=text, **kw)


@pytest.mark.parametrize("to_hp", [True, False], ids=["to_hp", "to_cp"])
def test_cutile_int32_limit_named_by_explain_at_the_edge(to_hp):
    """The cutile backend indexes with int32: a side of 2**31 elements is not for it and explain says so by its
    limit; 4 tokens fewer (a multiple of 2*cp) it is within it. Meta x (no memory) with cu_seqlens on the CPU (any
    device: the spec must not ask cu_seqlens to be on x's device)."""
    cp = 2
    op = TO_HP if to_hp else TO_CP
    for t, over in ((2**31, True), (2**31 - 4, False)):
        x = torch.empty((t // cp, cp) if to_hp else (t, 1), device="meta")   # 2**31 or 2**31 - 4 elements either side
        why = {b: r for b, _, r in op.explain(x, torch.tensor([0, t]), cp=cp)}
        assert ("cutile limit" in why["cutile"]) == over, why["cutile"]
        assert "< 2**31" in why["cutile"] if over else "int32" not in why["cutile"]


def test_bad_dtype_rank_stride_refused():
    cu = torch.tensor([0, 8])
    _refused(TO_HP, torch.ones(4, 2, dtype=torch.int32), cu, cp=2, match="dtype")
    _refused(TO_HP, _x(4, 2)[:, :, None], cu, cp=2, match="dims")
    _refused(TO_HP, _x(2, 4).t(), cu, cp=2, match="contiguous")
    _refused(TO_CP, _x(2, 8).t(), cu, cp=2, match="contiguous")


def test_collective_without_process_group_refused():
    assert not torch.distributed.is_initialized()
    _refused(TO_HP, _x(4, 2), torch.tensor([0, 8]), cp=2, match="not initialized")
    _refused(TO_CP, _x(8, 1), torch.tensor([0, 8]), match="not initialized")
    # explain says so for each backend: the cuTile pack kernels as well as the torch gathers need a process group
    for op, x, kw in ((TO_HP, _x(4, 2), dict(cp=2)), (TO_CP, _x(8, 1), {})):
        for name, ok, why in op.explain(x, torch.tensor([0, 8]), **kw):
            assert not ok and "torch.distributed is not initialized" in why, (name, why)


@pytest.mark.parametrize("group", ["x", 123, object()])
def test_group_of_another_type_refused(group):
    """group is None (the default group) or a ProcessGroup: anything else is named before any rule
    asks it for its size (it had escaped as an AttributeError from dist.get_world_size)."""
    _refused(TO_HP, _x(4, 2), torch.tensor([0, 8]), cp=2, group=group, match="param group: expected None or a")
    _refused(TO_CP, _x(8, 1), torch.tensor([0, 8]), group=group, match="param group: expected None or a")


def test_total_tokens_skips_the_host_read_and_is_checked():
    """total_tokens = cu_seqlens[-1] (the sync-free form for a GPU cu_seqlens) gives the same
    maps; a wrong one is refused (a host rule here: cu_seqlens on the CPU)."""
    cu = random_cu(2)
    t = int(cu[-1])
    got, want = PERM(cu, cp=2, split_sections=[2, 4], total_tokens=t), PERM(cu, cp=2, split_sections=[2, 4])
    for name in got._fields:
        assert_close(getattr(got, name), getattr(want, name), kind="exact", what=name)
    _refused(PERM, cu, cp=2, total_tokens=t + 4, match="total_tokens")


def test_torch_compile_refuses_by_name():
    """The CP ops read cu_seqlens' values on the host: torch.compile gets a NotImplementedError naming the op and
    what to do, not dynamo's data-dependent guard error (the collectives refuse the same way: the gloo worlds)."""
    op = registry.get("thd_cp_a2a_perm")
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    f = torch.compile(lambda c: op(c, cp=2, total_tokens=16), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="thd_cp_a2a_perm: torch.compile cannot trace the CP ops"):
        f(cu)
    assert op(cu, cp=2, total_tokens=16)[0].shape == (16,)  # eager as before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sections", [None, [4, 2, 6]], ids=["tokens", "sections"])
def test_total_tokens_form_captured_in_a_cuda_graph(sections):
    """thd_cp_a2a_perm is no collective, so OPS.md's hot path holds for it: with total_tokens and a GPU cu_seqlens
    nothing is read on the host and the call captures in a CUDA graph. The feature maps too: they are built on the
    device from the section widths (a host tensor copied in is a pageable copy, refused under capture: the op did
    that before session 70). Replays rewrite the maps (poisoned before each) and follow cu_seqlens' new values (same
    T), bitwise the reference's."""
    cp = 2
    cu = random_cu(cp).cuda()
    t = int(cu[-1])
    PERM(cu, cp=cp, split_sections=sections, total_tokens=t)   # eager first: the registry's cached call
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = PERM(cu, cp=cp, split_sections=sections, total_tokens=t)
    lens = (cu[1:] - cu[:-1]).cpu()
    for new_lens in (lens, lens.flip(0)):   # the same total in another order: new values for the replay
        cu.copy_(torch.cat([lens.new_zeros(1), new_lens.cumsum(0)]).to(cu.dtype))
        for m in got:
            if m is not None:
                m.fill_(-1)
        g.replay()
        torch.cuda.synchronize()
        want = ref.thd_cp_a2a_perm(cu.cpu(), cp=cp, split_sections=sections)
        for name in got._fields:
            w, o = getattr(want, name), getattr(got, name)
            assert (w is None) == (o is None), name
            if w is not None:
                assert_close(o.cpu(), w, kind="exact", what=f"{name} after a replay")
