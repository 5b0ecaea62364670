"""``SparsePlan``: BlockMask round trips, the dense mask against a loop over its definition, the
kernel against it, validation messages and the repr."""

import pytest
import torch
from sparse_kernels import SparsePlan, grid_permutation, permuted_block_sparse_attention
from sparse_kernels.attention import masked_attention_reference
from sparse_kernels.permuted import inverse_permutation, pair_bit, split_run_blocks
from sparse_kernels.testing import default_device, make_qkv
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

DEV = default_device()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _perm(lead: tuple, S: int, g) -> torch.Tensor:
    return torch.argsort(torch.rand(*lead, S, generator=g), -1).to(torch.int32).to(DEV)


def _disjoint_lists(lead, nqb, nkb, g, width=None):
    """Partial and full lists ``(idx, cnt, fidx, fcnt)`` with no block in both; the padding past
    the counts is garbage (-5) that must never be read."""
    score = torch.rand(*lead, nqb, nkb, generator=g)
    order = torch.argsort(torch.rand(*lead, nqb, nkb, generator=g), -1)
    kind = torch.where(score < 0.35, 1, torch.where(score < 0.55, 2, 0)).gather(-1, order)
    out = []
    for want in (1, 2):
        take = kind == want
        cnt = take.sum(-1)
        idx = torch.argsort((~take).to(torch.int8), dim=-1, stable=True)
        idx = order.gather(-1, idx)  # picked blocks first, in a random order
        idx = torch.where(torch.arange(nkb) < cnt[..., None], idx, -5)[..., : width or nkb]
        out += [idx.to(torch.int32).to(DEV), cnt.clamp_max(width or nkb).to(torch.int32).to(DEV)]
    return out


def _oracle(plan: SparsePlan, H: int) -> torch.Tensor:
    """The attended set by a loop over every (batch, head, original query, original key), from
    the class docstring's words alone."""
    B, (S_Q, S_KV), (bm, bn) = plan.batch, plan.seq_lengths, plan.block_size
    out = torch.zeros(B, H, S_Q, S_KV, dtype=torch.bool)

    def at(t, b, h):
        return None if t is None else t.cpu()[min(b, t.shape[0] - 1), min(h, t.shape[1] - 1)]

    def listed(idx, cnt, b, h, m):
        return set(at(idx, b, h)[m, : int(at(cnt, b, h)[m])].tolist()) if idx is not None else set()

    for b in range(B):
        for h in range(H):
            kh = plan.kv_perm.shape[1] if plan.kv_perm is not None else 1
            qp = at(plan.q_perm, b, h)
            kp = at(plan.kv_perm, b, h if kh in (1, H) else h // (H // kh))
            q_row = {int(x): r for r, x in enumerate(qp.tolist())} if qp is not None else None
            k_col = {int(x): c for c, x in enumerate(kp.tolist())} if kp is not None else None
            step = plan.kv_run_step
            step = int(at(step, b, h)) if isinstance(step, torch.Tensor) else step
            for i in range(S_Q):
                m = (q_row[i] if q_row else i) // bm
                part = listed(plan.kv_indices, plan.kv_num_blocks, b, h, m)
                full = listed(plan.full_kv_indices, plan.full_kv_num_blocks, b, h, m)
                runs = set()
                for s in listed(plan.kv_run_starts, plan.kv_run_counts, b, h, m):
                    runs |= {s + t * step for t in range(bn) if s + t * step < S_KV}
                for j in range(S_KV):
                    n = (k_col[j] if k_col else j) // bn
                    ok = n in part
                    if ok and plan.kv_block_pairs is not None:
                        pos = at(plan.kv_indices, b, h)[m].tolist().index(n)
                        bits = int(at(plan.kv_block_pairs, b, h)[m, pos])
                        qm = int(plan.q_modality.cpu()[min(b, plan.q_modality.shape[0] - 1), i])
                        km = int(plan.kv_modality.cpu()[min(b, plan.kv_modality.shape[0] - 1), j])
                        ok = bool(bits & pair_bit(qm, km))
                    ok = ok or j in runs
                    if plan.causal:
                        ok = ok and j <= i + S_KV - S_Q
                    out[b, h, i, j] = ok or n in full
    return out


def _plan_case(case: str) -> tuple[SparsePlan, int]:
    """(plan, H) of a named case: every optional part, odd lengths and blocks."""
    g = _gen(len(case))
    if case == "gqa-kvperm-per-kv-head-full-noncausal":
        S_Q, S_KV, bm, bn, H = 23, 29, 4, 8, 4
        idx, cnt, fidx, fcnt = _disjoint_lists((1, H), 6, 4, g)
        return SparsePlan(
            kv_indices=idx, kv_num_blocks=cnt, full_kv_indices=fidx, full_kv_num_blocks=fcnt,
            seq_lengths=(S_Q, S_KV), block_size=(bm, bn), causal=False,
            q_perm=_perm((1, H), S_Q, g), kv_perm=_perm((2,), S_KV, g),
        ), H  # fmt: skip
    if case == "batch2-shared-lists-causal-sq-below-skv":
        S_Q, S_KV, bm, bn, H = 19, 31, 8, 4, 2
        idx, cnt, fidx, fcnt = _disjoint_lists((2, 1), 3, 8, g, width=5)
        return SparsePlan(
            kv_indices=idx, kv_num_blocks=cnt, full_kv_indices=fidx, full_kv_num_blocks=fcnt,
            seq_lengths=(S_Q, S_KV), block_size=(bm, bn), q_perm=_perm((2, 1), S_Q, g),
        ), H  # fmt: skip
    if case == "grid-runs-step-per-head":
        S, blk, H = 40, 4, 2
        p = grid_permutation(S, torch.tensor([5, 3]), torch.tensor([1, 0]))
        idx, cnt, _, _ = _disjoint_lists((1, H), 10, 10, g)
        starts = torch.randint(0, S, (1, H, 10, 2), generator=g, dtype=torch.int32)
        return SparsePlan(
            kv_indices=idx, kv_num_blocks=cnt, seq_lengths=(S, S), block_size=blk,
            q_perm=p.perm.to(DEV), kv_perm=p.perm.to(DEV), q_perm_inv=p.inverse.to(DEV),
            kv_run_starts=starts.to(DEV),
            kv_run_counts=torch.randint(0, 3, (1, H, 10), generator=g, dtype=torch.int32).to(DEV),
            kv_run_step=torch.tensor([[5, 3]], device=DEV),
        ), H  # fmt: skip
    if case == "modality-pairs":
        S, blk, H = 30, 8, 2
        mod = torch.randint(0, 3, (S,), generator=g).to(DEV)
        perm = torch.argsort(mod * S + torch.arange(S, device=DEV)).to(torch.int32)
        idx, cnt, _, _ = _disjoint_lists((1, H), 4, 4, g)
        pairs = torch.randint(-(2**62), 2**62, (1, H, 4, 4), generator=g).to(DEV)
        return SparsePlan(
            kv_indices=idx, kv_num_blocks=cnt, seq_lengths=(S, S), block_size=blk,
            q_perm=perm, kv_perm=perm, q_modality=mod, kv_modality=mod, kv_block_pairs=pairs,
        ), H  # fmt: skip
    raise ValueError(case)


CASES = [
    "gqa-kvperm-per-kv-head-full-noncausal",
    "batch2-shared-lists-causal-sq-below-skv",
    "grid-runs-step-per-head",
    "modality-pairs",
]


@pytest.mark.parametrize("case", CASES)
def test_to_dense_equals_a_loop_over_the_definition(case):
    plan, H = _plan_case(case)
    got = plan.to_dense(heads=H)
    assert got.dtype == torch.bool and got.shape == (plan.batch, H, *plan.seq_lengths)
    want = _oracle(plan, H)
    assert torch.equal(got.cpu(), want)
    assert 0 < int(want.sum()) < want.numel()  # the case attends some pairs, not all


def test_kernel_on_a_plan_with_every_part():
    """Grid permutations with their inverses, full lists and the grid lines' runs (split off
    the partial lists, step = each head's stride): the Triton kernel equals attention over
    ``to_dense``, itself checked against the loop."""
    S, blk, H, H_KV = 100, 16, 4, 2
    g = _gen(7)
    st = torch.tensor([2, 3, 4, 5])
    pq = grid_permutation(S, st, torch.tensor([1, 2, 3, 0]))
    pk = grid_permutation(S, st, torch.tensor([0, 1, 1, 2]))
    idx, cnt, fidx, fcnt = _disjoint_lists((1, H), 7, 7, g)
    kv_perm, step = pk.perm[None].to(DEV), st[None].to(DEV)
    idx, cnt, rs, rc = split_run_blocks(kv_perm, idx, cnt, blk, step=step)
    assert int(rc.sum()) > 0 and int(cnt.sum()) > 0
    plan = SparsePlan(
        kv_indices=idx, kv_num_blocks=cnt, full_kv_indices=fidx, full_kv_num_blocks=fcnt,
        seq_lengths=(S, S), block_size=blk, q_perm=pq.perm[None].to(DEV),
        q_perm_inv=pq.inverse[None].to(DEV), kv_perm=kv_perm, kv_run_starts=rs,
        kv_run_counts=rc, kv_run_step=step,
    )  # fmt: skip
    assert torch.equal(plan.to_dense(heads=H).cpu(), _oracle(plan, H))
    q, k, v = make_qkv(1, H, H_KV, S, S, 32, dtype=torch.float32, device=DEV, seed=4)
    res = permuted_block_sparse_attention(q, k, v, plan, impl="triton")
    want = masked_attention_reference(
        q, k, v, plan.to_dense(heads=H), scale=32**-0.5, compute_dtype=torch.float64
    )
    torch.testing.assert_close(res.out, want.out, atol=2e-5, rtol=0)


def _block_mask(B, H, S_Q, S_KV, blk):
    bm, bn = (blk, blk) if isinstance(blk, int) else blk

    def mask_mod(b, h, q_idx, kv_idx):
        # Whole blocks in or out, then causal: blocks below the diagonal become full blocks.
        keep = (q_idx // bm + kv_idx // bn + h) % 3 != 0
        return keep & (kv_idx <= q_idx + S_KV - S_Q)

    return create_block_mask(mask_mod, B, H, S_Q, S_KV, device=DEV.type, BLOCK_SIZE=blk)


@pytest.mark.parametrize(
    "B,H,S_Q,S_KV,blk",
    [
        pytest.param(1, 2, 200, 200, 32, id="B1-H2-S200-b32"),
        pytest.param(2, 1, 70, 130, (16, 32), id="B2-H1-SQ70-SKV130-b16x32"),
        pytest.param(None, None, 128, 128, 64, id="broadcast-S128-b64"),
    ],
)
def test_block_mask_round_trip_is_exact(B, H, S_Q, S_KV, blk):
    bm = _block_mask(B, H, S_Q, S_KV, blk)
    assert bm.full_kv_num_blocks is not None and int(bm.full_kv_num_blocks.sum()) > 0
    plan = SparsePlan.from_block_mask(bm)
    assert plan.kv_indices is bm.kv_indices  # no copies
    back = plan.to_block_mask()
    assert isinstance(back, BlockMask)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(back, name), getattr(bm, name)), name
    assert tuple(back.BLOCK_SIZE) == tuple(bm.BLOCK_SIZE)
    assert tuple(back.seq_lengths) == (S_Q, S_KV)
    assert torch.equal(SparsePlan.from_block_mask(back).to_dense(), plan.to_dense())


def test_to_block_mask_flex_attention_computes_to_dense():
    """Eager flex_attention evaluates the mask_mod everywhere: it must agree with the lists."""
    S, H = 96, 2
    idx, cnt, fidx, fcnt = _disjoint_lists((1, H), 3, 3, _gen(2), width=2)  # narrower than NKB
    plan = SparsePlan(
        kv_indices=idx, kv_num_blocks=cnt, full_kv_indices=fidx, full_kv_num_blocks=fcnt,
        seq_lengths=(S, S), block_size=32,
    )  # fmt: skip
    q, k, v = make_qkv(1, H, H, S, S, 16, dtype=torch.float32, device=DEV, seed=5)
    rows = plan.to_dense(heads=H).any(-1)  # flex gives rows with no key NaN or 0: compare others
    bm = plan.to_block_mask()
    assert bm.kv_indices.shape == (1, H, 3, 3)  # padded to NKB for FlexAttention
    assert torch.equal(SparsePlan.from_block_mask(bm).to_dense(), plan.to_dense())
    got = flex_attention(q, k, v, block_mask=bm)
    want = permuted_block_sparse_attention(q, k, v, plan, impl="reference").out
    torch.testing.assert_close(got[rows.expand_as(got[..., 0])], want[rows.expand_as(want[..., 0])],
                               atol=1e-5, rtol=1e-5)  # fmt: skip


def _small(**over):
    kw = dict(
        kv_indices=torch.zeros(1, 2, 3, 2, dtype=torch.int32, device=DEV),
        kv_num_blocks=torch.ones(1, 2, 3, dtype=torch.int32, device=DEV),
        seq_lengths=(40, 50),
        block_size=(16, 32),
    )
    kw.update(over)
    return kw


def test_to_block_mask_raises_for_what_it_cannot_express():
    ident = torch.arange(40, dtype=torch.int32, device=DEV)
    plain = SparsePlan(**_small()).to_block_mask()
    same = SparsePlan(**_small(q_perm=ident)).to_block_mask()  # identity: dropped
    assert torch.equal(plain.kv_indices, same.kv_indices)
    bad = [
        (_small(q_perm=ident.flip(0)), "non-identity q_perm"),
        (_small(kv_perm=torch.arange(50, dtype=torch.int32, device=DEV).roll(1)), "non-identity kv_perm"),
        (_small(kv_run_starts=torch.zeros(1, 2, 3, 1, dtype=torch.int32, device=DEV),
                kv_run_counts=torch.zeros(1, 2, 3, dtype=torch.int32, device=DEV)), "kv_run_starts"),
        (_small(q_modality=_i32(40), kv_modality=torch.zeros(50, dtype=torch.int32, device=DEV),
                kv_block_pairs=torch.ones(1, 2, 3, 2, dtype=torch.int64, device=DEV)), "kv_block_pairs"),
    ]  # fmt: skip
    for kw, needle in bad:
        with pytest.raises(NotImplementedError, match=needle):
            SparsePlan(**kw).to_block_mask()


def test_inverses_are_given_or_made_once():
    g = _gen(1)
    p = grid_permutation(40, 6, 2)
    given = SparsePlan(**_small(q_perm=p.perm.to(DEV), q_perm_inv=p.inverse.to(DEV)))
    assert given.q_inverse is given.q_perm_inv
    kv = _perm((2,), 50, g)
    made = SparsePlan(**_small(kv_perm=kv))
    assert made.kv_perm_inv is None and made.q_inverse is None
    assert torch.equal(made.kv_inverse, inverse_permutation(made.kv_perm))
    assert made.kv_inverse.dtype == torch.int32 and made.kv_inverse.shape == (1, 2, 50)
    assert made.kv_inverse is made.kv_inverse  # cached


def test_repr_shows_shapes_and_dtypes():
    plan = SparsePlan(**_small(q_perm=torch.arange(40, dtype=torch.int32, device=DEV)))
    assert repr(plan) == (
        f"SparsePlan(seq_lengths=(40, 50), block_size=(16, 32), causal=True, "
        f"device={plan.kv_indices.device}, "
        "kv_num_blocks=int32[1, 2, 3], kv_indices=int32[1, 2, 3, 2], q_perm=int32[1, 1, 40])"
    )
    runs = SparsePlan(**_small(
        kv_run_starts=torch.zeros(1, 2, 3, 1, dtype=torch.int32, device=DEV),
        kv_run_counts=torch.zeros(1, 2, 3, dtype=torch.int32, device=DEV), kv_run_step=4,
    ))  # fmt: skip
    assert repr(runs).endswith(
        "kv_run_starts=int32[1, 2, 3, 1], kv_run_counts=int32[1, 2, 3], kv_run_step=4)"
    )


def _i32(*shape):
    return torch.zeros(*shape, dtype=torch.int32, device=DEV)


def _pairs(**over):
    base = dict(q_modality=_i32(40), kv_modality=_i32(50),
                kv_block_pairs=torch.ones(1, 2, 3, 2, dtype=torch.int64, device=DEV))  # fmt: skip
    base.update(over)
    return base


def _runs(**over):
    base = dict(kv_run_starts=_i32(1, 2, 3, 1), kv_run_counts=_i32(1, 2, 3))
    base.update(over)
    return base


# (overrides of a valid plan, exception, substrings: the field, the expected, the received)
BAD = [
    pytest.param(dict(kv_indices=[[0]]), TypeError, ["kv_indices", "torch.Tensor", "got list"], id="indices-list"),
    pytest.param(dict(kv_indices=_i32(1, 2, 3, 2).long()), TypeError, ["kv_indices", "dtype int32", "got torch.int64"], id="indices-int64"),
    pytest.param(dict(kv_num_blocks=_i32(1, 2, 3).to(torch.int16)), TypeError, ["kv_num_blocks", "int32", "got torch.int16"], id="counts-int16"),
    pytest.param(dict(kv_indices=_i32(1, 2, 4, 2)), ValueError, ["kv_indices", "NQB=3", "got (1, 2, 4, 2)"], id="indices-nqb"),
    pytest.param(dict(kv_indices=_i32(2, 3, 2)), ValueError, ["kv_indices", "[B', H', NQB=3, W]", "got (2, 3, 2)"], id="indices-3d"),
    pytest.param(dict(kv_num_blocks=_i32(1, 1, 3)), ValueError, ["kv_num_blocks", "[1, 2, 3] (as kv_indices)", "got (1, 1, 3)"], id="counts-heads"),
    pytest.param(dict(kv_num_blocks=_i32(1, 2, 3).to("meta")), ValueError, ["kv_num_blocks", f"on {DEV}", "got meta"], id="counts-device"),
    pytest.param(dict(full_kv_indices=_i32(1, 2, 3, 1)), ValueError, ["full_kv_num_blocks and full_kv_indices", "both or neither", "full_kv_num_blocks=None"], id="full-without-counts"),
    pytest.param(dict(full_kv_indices=_i32(1, 2, 3, 1), full_kv_num_blocks=_i32(1, 2, 2)), ValueError, ["full_kv_num_blocks", "[1, 2, 3]", "got (1, 2, 2)"], id="full-counts-shape"),
    pytest.param(dict(block_size=0), ValueError, ["block_size", ">= 1", "got (0, 0)"], id="block-zero"),
    pytest.param(dict(block_size=(16.0, 32)), TypeError, ["block_size", "pair of ints", "got (16.0, 32)"], id="block-float"),
    pytest.param(dict(block_size=(True, 32)), TypeError, ["block_size", "pair of ints"], id="block-bool"),
    pytest.param(dict(seq_lengths=40), TypeError, ["seq_lengths", "pair of ints (S_Q, S_KV)", "got 40"], id="seq-lengths-int"),
    pytest.param(dict(seq_lengths=(0, 50)), ValueError, ["seq_lengths", ">= 1", "got (0, 50)"], id="seq-lengths-zero"),
    pytest.param(dict(causal="False"), TypeError, ["causal", "a bool", "got str 'False'"], id="causal-str"),
    pytest.param(dict(check_contents=None), TypeError, ["check_contents", "a bool", "got NoneType"], id="check-none"),
    pytest.param(dict(q_perm=_i32(39)), ValueError, ["q_perm", "[40], [heads, 40] or [B', heads, 40]", "got (39,)"], id="q_perm-short"),
    pytest.param(dict(kv_perm=_i32(1, 1, 1, 50)), ValueError, ["kv_perm", "[50]", "got (1, 1, 1, 50)"], id="kv_perm-4d"),
    pytest.param(dict(q_perm=torch.arange(40, device=DEV)), TypeError, ["q_perm", "dtype int32", "got torch.int64"], id="q_perm-int64"),
    pytest.param(dict(q_perm=torch.arange(40.0, device=DEV)), TypeError, ["q_perm", "dtype int32", "got torch.float32"], id="q_perm-float"),
    pytest.param(dict(kv_perm=_i32(50).to("meta")), ValueError, ["kv_perm", f"on {DEV}", "got meta"], id="kv_perm-device"),
    pytest.param(dict(q_perm_inv=_i32(40)), ValueError, ["q_perm_inv", "None without q_perm", "got a tensor"], id="inverse-without-perm"),
    pytest.param(dict(q_perm=_i32(2, 40), q_perm_inv=_i32(40)), ValueError, ["q_perm_inv", "shape of q_perm (1, 2, 40)", "got (1, 1, 40)"], id="inverse-shape"),
    pytest.param(dict(q_perm=_i32(3, 40)), ValueError, ["heads dims", "kv_indices: 2", "q_perm: 3"], id="q_perm-heads-vs-lists"),
    pytest.param(dict(kv_indices=_i32(2, 2, 3, 2), kv_num_blocks=_i32(2, 2, 3), kv_perm=_i32(3, 1, 50)), ValueError, ["batch dims", "kv_indices: 2", "kv_perm: 3"], id="kv_perm-batch-vs-lists"),
    pytest.param(_runs(kv_run_counts=None), ValueError, ["kv_run_starts and kv_run_counts", "both or neither", "kv_run_counts=None"], id="runs-without-counts"),
    pytest.param(_runs(kv_run_counts=_i32(1, 2)), ValueError, ["kv_run_counts", "[1, 2, 3] (as kv_run_starts)", "got (1, 2)"], id="run-counts-shape"),
    pytest.param(_runs(kv_run_step=0), ValueError, ["kv_run_step", "int >= 1", "got 0"], id="run-step-zero"),
    pytest.param(_runs(kv_run_step=2.0), TypeError, ["kv_run_step", "an int or an int tensor", "got float"], id="run-step-float"),
    pytest.param(_runs(kv_run_step=torch.ones(2, dtype=torch.int64, device=DEV)), ValueError, ["kv_run_step", "[B'|1, H'|1]", "got (2,)"], id="run-step-1d"),
    pytest.param(_runs(kv_run_step=torch.ones(1, 2, device=DEV)), TypeError, ["kv_run_step", "int32 or int64", "got torch.float32"], id="run-step-float-tensor"),
    pytest.param(dict(q_modality=_i32(40)), ValueError, ["q_modality and kv_modality and kv_block_pairs", "all or none", "kv_modality=None"], id="pairs-partial"),
    pytest.param(_pairs(q_modality=_i32(39)), ValueError, ["q_modality", "[40] or [B', 40]", "got (39,)"], id="modality-short"),
    pytest.param(_pairs(kv_block_pairs=torch.ones(1, 2, 3, 1, dtype=torch.int64, device=DEV)), ValueError, ["kv_block_pairs", "(1, 2, 3, 2) (kv_indices')", "got (1, 2, 3, 1)"], id="pairs-shape"),
    pytest.param(dict(_pairs(), **_runs()), NotImplementedError, ["run list", "takes no pair masks"], id="runs-with-pairs"),
]  # fmt: skip


@pytest.mark.parametrize("over,exc,needles", BAD)
def test_bad_fields_raise_at_construction(over, exc, needles):
    with pytest.raises(exc) as err:
        SparsePlan(**_small(**over))
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


def test_from_block_mask_takes_only_block_masks():
    with pytest.raises(TypeError, match="expected a flex_attention BlockMask, got Tensor"):
        SparsePlan.from_block_mask(_i32(1, 1, 1))


def test_to_dense_heads_must_match_the_plan():
    plan = SparsePlan(**_small(kv_perm=_perm((2,), 50, _gen(0))))
    assert plan.to_dense().shape == (1, 2, 40, 50)
    with pytest.raises(ValueError, match=r"expected the plan's H'=2 .* got 4"):
        plan.to_dense(heads=4)
    shared = SparsePlan(**_small(kv_indices=_i32(1, 1, 3, 2), kv_num_blocks=_i32(1, 1, 3),
                                 kv_perm=_perm((2,), 50, _gen(1))))  # fmt: skip
    assert shared.to_dense(heads=6).shape == (1, 6, 40, 50)  # per KV head: groups of 3
    with pytest.raises(ValueError, match=r"kv_perm has 2 heads; expected heads \(H=3\)"):
        shared.to_dense(heads=3)
