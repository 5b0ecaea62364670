"""Bad inputs of ``permuted_block_sparse_attention``: a plan with bad contents is rejected when it
is built (``SparsePlan``'s content checks, on by default), a plan that does not fit q, k, v at the
call; each error names the expected and the received value, before any launch, on both engines
(the Triton kernel under the interpreter on the CPU, compiled on CUDA). With the content checks
off, the Triton kernel bounds counts, query permutation entries and run steps itself.
"""

import pytest
import torch
from sparse_kernels import SparsePlan, permuted_block_sparse_attention
from sparse_kernels._validate import interpreter_enabled
from sparse_kernels.permuted import permuted_block_sparse_attention_reference
from sparse_kernels.testing import assert_close_budget, default_device, make_qkv

DEV = default_device()
IMPLS = [
    "reference",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(
            DEV.type != "cuda" and not interpreter_enabled(),
            reason="the Triton path needs CUDA or TRITON_INTERPRET=1",
        ),
    ),
]
# q [1, 2, 64, 16], k/v [1, 1, 64, 16]; blocks of 32: NQB = NKB = 2.
S, BLOCK = 64, 32


def _t(x, dtype=torch.int32):
    return torch.tensor(x, dtype=dtype, device=DEV)


def _qkv(dtype=torch.float32):
    return make_qkv(1, 2, 1, S, S, 16, dtype=dtype, device=DEV, seed=11)


def _kw(**over):
    """A valid plan: reversed query order, a rotated key order, query block 0 lists key block 0,
    query block 1 lists key blocks 1 and 0."""
    kw = dict(
        q_perm=torch.arange(S - 1, -1, -1, dtype=torch.int32, device=DEV),
        kv_perm=torch.roll(torch.arange(S, dtype=torch.int32, device=DEV), 5),
        kv_indices=_t([[[[0, 1], [1, 0]]]]),
        kv_num_blocks=_t([[[1, 2]]]),
        block_size=BLOCK,
        seq_lengths=(S, S),
    )
    kw.update(over)
    return kw


def _perm_with(pos: int, value: int) -> torch.Tensor:
    p = torch.arange(S, dtype=torch.int32, device=DEV)
    p[pos] = value
    return p


def _modality(**over):
    base = dict(
        q_modality=torch.zeros(S, dtype=torch.int32, device=DEV),
        kv_modality=torch.zeros(S, dtype=torch.int32, device=DEV),
        kv_block_pairs=torch.full((1, 1, 2, 2), -1, dtype=torch.int64, device=DEV),
    )
    base.update(over)
    return base


def _runs(**over):
    base = dict(kv_indices=_t([[[[0], [1]]]]), kv_num_blocks=_t([[[1, 0]]]),
                kv_run_starts=_t([[[[0], [0]]]]), kv_run_counts=_t([[[0, 1]]]))  # fmt: skip
    base.update(over)
    return base


# (overrides of the valid plan, substrings the message must hold: the field, the expected
# values, the received value)
CONTENTS = [
    pytest.param(dict(q_perm=_perm_with(3, S)), ["q_perm", "permutation of 0..63", "[0, 64)", "got 64"], id="q_perm-entry-past-end"),
    pytest.param(dict(kv_perm=_perm_with(0, -1)), ["kv_perm", "permutation of 0..63", "got -1"], id="kv_perm-negative-entry"),
    pytest.param(dict(q_perm=_perm_with(7, 3)), ["q_perm", "exactly once", "got 3 2 times", "1 of 0..63 missing"], id="q_perm-repeat"),
    pytest.param(dict(kv_perm=torch.zeros(S, dtype=torch.int32, device=DEV)), ["kv_perm", "exactly once", "got 0 64 times"], id="kv_perm-constant"),
    pytest.param(dict(q_perm=torch.stack([torch.arange(S), torch.arange(S).flip(0) % 32]).int().to(DEV)), ["q_perm", "exactly once", "row [0, 1]"], id="q_perm-second-head-repeat"),
    pytest.param(dict(q_perm_inv=torch.arange(S, dtype=torch.int32, device=DEV)), ["q_perm_inv", "the inverse of q_perm", "got q_perm[q_perm_inv[0]] = 63"], id="q_perm_inv-not-inverse"),
    pytest.param(dict(kv_num_blocks=_t([[[1, 3]]])), ["kv_num_blocks", "[0, W=2]", "got 3"], id="count-above-width"),
    pytest.param(dict(kv_num_blocks=_t([[[-1, 2]]])), ["kv_num_blocks", "[0, W=2]", "got -1"], id="count-negative"),
    pytest.param(dict(kv_indices=_t([[[[2, 1], [1, 0]]]])), ["kv_indices", "listed key blocks in [0, 2)", "got 2"], id="block-past-end"),
    pytest.param(dict(kv_indices=_t([[[[0, 1], [1, -3]]]])), ["kv_indices", "[0, 2)", "got -3"], id="block-negative"),
    pytest.param(dict(kv_indices=_t([[[[0, 1], [1, 1]]]])), ["at most once", "key block 1 listed 2 times", "[0, 0, 1]"], id="block-twice"),
    pytest.param(dict(full_kv_indices=_t([[[[1], [0]]]]), full_kv_num_blocks=_t([[[0, 1]]])), ["over both lists", "key block 0 listed 2 times"], id="block-in-both-lists"),
    pytest.param(dict(full_kv_indices=_t([[[[1], [0]]]]), full_kv_num_blocks=_t([[[2, 0]]])), ["full_kv_num_blocks", "[0, W=1]", "got 2"], id="full-count-above-width"),
    pytest.param(dict(full_kv_indices=_t([[[[5], [0]]]]), full_kv_num_blocks=_t([[[1, 0]]])), ["full_kv_indices", "[0, 2)", "got 5"], id="full-block-past-end"),
    pytest.param(_runs(kv_run_starts=_t([[[[0], [64]]]])), ["kv_run_starts", "original key positions in [0, 64)", "got 64"], id="run-start-past-end"),
    pytest.param(_runs(kv_run_counts=_t([[[0, 2]]])), ["kv_run_counts", "[0, R=1]", "got 2"], id="run-count-above-width"),
    pytest.param(_runs(kv_run_step=_t([[1, 0]], torch.int64)), ["kv_run_step", "steps >= 1", "got 0"], id="run-step-zero"),
    pytest.param(_modality(kv_modality=torch.full((S,), 8, dtype=torch.int32, device=DEV)), ["kv_modality", "modality ids in [0, 8)", "got 8"], id="modality-9th"),
]  # fmt: skip


@pytest.mark.parametrize("over,needles", CONTENTS)
def test_bad_contents_raise_when_the_plan_is_built(over, needles):
    with pytest.raises(ValueError) as err:
        SparsePlan(**_kw(**over))
    msg = str(err.value)
    assert "expected" in msg and "got" in msg, msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    # The same plan built unchecked raises from check().
    plan = SparsePlan(**_kw(**over), check_contents=False)
    with pytest.raises(ValueError, match="expected"):
        plan.check()


def test_valid_plan_passes_its_checks():
    plan = SparsePlan(**_kw(), check_contents=False)
    assert plan.check() is plan


# A valid plan that does not fit q [1, 2, 64, 16], k/v [1, 1, 64, 16].
MISFITS = [
    pytest.param(dict(seq_lengths=(S, S + 1), kv_perm=None), ValueError, ["plan.seq_lengths", "(64, 64)", "got (64, 65)"], id="seq-lengths"),
    pytest.param(dict(kv_indices=_t([[[[0, 1], [1, 0]]]] * 2), kv_num_blocks=_t([[[1, 2]]] * 2)), ValueError, ["batch dims of 1 or B=1", "got 2"], id="batch"),
    pytest.param(dict(kv_indices=_t([[[[0, 1], [1, 0]]] * 3]), kv_num_blocks=_t([[[1, 2]] * 3])), ValueError, ["head dims of 1 or H=2", "got 3"], id="heads"),
    pytest.param(dict(kv_perm=torch.arange(S, dtype=torch.int32, device=DEV).repeat(3, 1)), ValueError, ["plan.kv_perm", "H_KV=1 or H=2", "got 3"], id="kv_perm-heads"),
]  # fmt: skip


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("over,exc,needles", MISFITS)
def test_plan_that_does_not_fit_raises(over, exc, needles, impl):
    q, k, v = _qkv()
    plan = SparsePlan(**_kw(**over))
    with pytest.raises(exc) as err:
        permuted_block_sparse_attention(q, k, v, plan, impl=impl)
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


@pytest.mark.parametrize("impl", IMPLS)
def test_plan_of_another_device_or_type_raises(impl):
    q, k, v = _qkv()
    plan = SparsePlan(**{n: t.to("meta") if isinstance(t, torch.Tensor) else t
                         for n, t in _kw().items()}, check_contents=False)  # fmt: skip
    with pytest.raises(
        ValueError, match=rf"expected tensors on {q.device} \(q's device\), got meta"
    ):
        permuted_block_sparse_attention(q, k, v, plan, impl=impl)
    with pytest.raises(TypeError, match="plan: expected a SparsePlan, got dict"):
        permuted_block_sparse_attention(q, k, v, _kw(), impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_index_tensors_of_any_layout(impl):
    """Strided and broadcast index tensors give the result of their contiguous copies."""
    q, k, v = _qkv()
    base = _kw()
    wide = torch.stack([base["kv_indices"], base["kv_indices"].flip(-1)], -1)
    strided = dict(
        q_perm=torch.stack([base["q_perm"], base["q_perm"]], -1)[:, 0],
        kv_perm=base["kv_perm"].expand(2, S),
        kv_indices=wide[..., 0].expand(1, 2, 2, 2),
        kv_num_blocks=base["kv_num_blocks"].expand(1, 2, 2),
    )
    assert strided["q_perm"].stride(-1) == 2 and strided["kv_indices"].stride(-1) == 2
    got = permuted_block_sparse_attention(q, k, v, SparsePlan(**_kw(**strided)), impl=impl)
    want = permuted_block_sparse_attention(q, k, v, SparsePlan(**base), impl=impl)
    torch.testing.assert_close(got.out, want.out, atol=0, rtol=0)
    torch.testing.assert_close(got.lse, want.lse, atol=0, rtol=0)


# Unchecked bad contents (check_contents=False) that the Triton kernel bounds itself: undefined
# output, no access out of bounds. (Block numbers, run starts and kv_perm entries are not bounded
# there: see docs/kernels/permuted.md.)
UNCHECKED = [
    pytest.param(dict(q_perm=_perm_with(3, 10**6)), id="q_perm-entry-far-past-end"),
    pytest.param(dict(q_perm=_perm_with(0, -(10**6))), id="q_perm-entry-far-negative"),
    pytest.param(dict(kv_num_blocks=_t([[[1, 10**6]]])), id="count-far-above-width"),
    pytest.param(dict(full_kv_indices=_t([[[[1], [0]]]]), full_kv_num_blocks=_t([[[10**6, 0]]])), id="full-count-far-above-width"),
    pytest.param(_runs(kv_run_counts=_t([[[0, 10**6]]])), id="run-count-far-above-width"),
    pytest.param(_runs(kv_run_step=_t([[-(10**6), 10**9]], torch.int64)), id="run-steps-out"),
    pytest.param(_modality(kv_modality=torch.full((S,), 10**6, dtype=torch.int32, device=DEV)), id="modality-far-out"),
]  # fmt: skip


@pytest.mark.parametrize("over", UNCHECKED)
@pytest.mark.parametrize("impl", IMPLS[1:])
def test_unchecked_bad_input_stays_in_bounds(over, impl):
    """Run in this process: an out-of-bounds access would crash it (or, under the interpreter,
    raise from numpy). The values are undefined; the rows are only required to be shaped."""
    q, k, v = _qkv()
    plan = SparsePlan(**_kw(**over), check_contents=False)
    res = permuted_block_sparse_attention(q, k, v, plan, impl=impl)
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    assert res.out.shape == q.shape and res.lse.shape == q.shape[:3]


@pytest.mark.parametrize("impl", IMPLS)
def test_fp16_scores_above_fp16_max_stay_finite(impl):
    """q . k = 16 * 70 * 70 = 78400 > 65504: an fp16 product would be inf and the rows NaN."""
    q, k, v = _qkv(torch.float16)
    q = torch.full_like(q, 70.0)
    k = torch.full_like(k, 70.0)
    k[:, :, ::3] = -70.0  # scores of +-78400 (scaled: +-19600)
    plan = SparsePlan(**_kw())
    res = permuted_block_sparse_attention(q, k, v, plan, impl=impl)
    gold = permuted_block_sparse_attention_reference(q, k, v, plan, compute_dtype=torch.float64)
    assert torch.isfinite(res.out).all() and torch.isfinite(res.lse).all()
    assert_close_budget(res.out, gold.out.half(), gold.out, dtype=torch.float16, name="out")
    torch.testing.assert_close(res.lse, gold.lse, atol=0.1, rtol=1e-4)
