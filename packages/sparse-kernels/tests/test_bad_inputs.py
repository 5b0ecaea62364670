"""Bad and hostile inputs of the attention ops: each is rejected before any launch with an error
that names the expected and the received value, or gives the reference's answer.

Run on both engines: the Triton kernels under the interpreter on the CPU, compiled on CUDA.
"""

import dataclasses
import math

import pytest
import torch
from sparse_kernels import (
    SparsePlan,
    attention,
    block_sparse_attention,
    build_vertical_slash_index,
    grid_permutation,
    line_folds,
    line_scores,
    merge_attention,
    permuted_block_sparse_attention,
    triangle_attention,
    vertical_slash_attention,
)
from sparse_kernels.attention import attention_reference
from sparse_kernels.block_sparse import block_sparse_attention_reference
from sparse_kernels.testing import assert_close_budget, default_device, make_qkv
from sparse_kernels.triangle import triangle_attention_reference
from sparse_kernels.vertical_slash import vertical_slash_attention_reference
from torch.nn.attention.flex_attention import BlockMask

DEV = default_device()
IMPLS = ["reference", "triton"]


def _lists(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``kv_num_blocks``, ``kv_indices`` of a ``[B, H, NQB, NKB]`` bool block selection."""
    order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)
    return sel.sum(-1).to(torch.int32), order.to(torch.int32)


# ------------------------------------------------------------------------------------------
# block_sparse_attention: lists of any layout


def _strided(idx: torch.Tensor, layout: str) -> torch.Tensor:
    """The same lists with a last dim that is not contiguous."""
    if layout == "every-other":
        wide = torch.full((*idx.shape[:-1], 2 * idx.shape[-1]), 0, dtype=idx.dtype)
        wide = wide.to(idx.device)
        wide[..., 1::2] = idx.flip(-1)  # valid block numbers in the skipped slots
        wide[..., ::2] = idx
        return wide[..., ::2]
    return idx.transpose(-1, -2).contiguous().transpose(-1, -2)  # column-major


@pytest.mark.parametrize("full", [False, True], ids=["partial", "partial+full"])
@pytest.mark.parametrize("layout", ["every-other", "column-major"])
def test_block_sparse_lists_with_a_strided_last_dim(layout, full):
    S, BM = 256, 64
    q, k, v = make_qkv(1, 2, 1, S, S, 32, dtype=torch.float16, device=DEV, seed=3)
    g = torch.Generator().manual_seed(5)
    sel = (torch.rand(1, 2, 4, 4, generator=g) < 0.6) | torch.eye(4, dtype=torch.bool)
    fsel = sel & (torch.rand(1, 2, 4, 4, generator=g) < 0.5) if full else None
    pn, pi = _lists((sel & ~fsel if full else sel).to(DEV))
    args = [pn, _strided(pi, layout)]
    if full:
        fn, fi = _lists(fsel.to(DEV))
        args += [fn, _strided(fi, layout)]
    assert args[1].stride(-1) != 1
    bm = BlockMask.from_kv_blocks(*args, BLOCK_SIZE=(BM, BM))
    res = block_sparse_attention(q, k, v, bm, impl="triton")
    dense_bm = BlockMask.from_kv_blocks(*(a.contiguous() for a in args), BLOCK_SIZE=(BM, BM))
    gold = block_sparse_attention_reference(q, k, v, dense_bm, compute_dtype=torch.float64)
    low = block_sparse_attention_reference(q, k, v, dense_bm, compute_dtype=torch.float16)
    assert_close_budget(res.out, low.out, gold.out, dtype=torch.float16)


# ------------------------------------------------------------------------------------------
# vertical_slash_attention: the indices' [B, H] are q's


def _vs_indices(B: int, H: int, dtype=torch.int32) -> tuple[torch.Tensor, torch.Tensor]:
    vi = torch.tensor([3, 40, 90], dtype=dtype).expand(B, H, 3).contiguous()
    # One slash: the diagonal tiles; the verticals 3 and 40 stay leftover columns of block 1.
    si = torch.tensor([0], dtype=dtype).expand(B, H, 1).contiguous()
    return vi.to(DEV), si.to(DEV)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "B_idx,H_idx",
    [
        pytest.param(1, 1, id="H1-for-H4"),
        pytest.param(1, 2, id="H2-for-H4-the-KV-heads"),
        pytest.param(1, 8, id="H8-for-H4"),
        pytest.param(2, 4, id="B2-for-B1"),
    ],
)
def test_vertical_slash_indices_must_have_qs_batch_and_heads(B_idx, H_idx, impl):
    q, k, v = make_qkv(1, 4, 2, 128, 128, 32, dtype=torch.float16, device=DEV)
    vi, si = _vs_indices(B_idx, H_idx)
    want = rf"expected shape \[B=1, H=4, NV\], got \({B_idx}, {H_idx}, 3\)"
    with pytest.raises(ValueError, match=rf"vertical_indices: {want}"):
        vertical_slash_attention(q, k, v, vi, si, impl=impl)
    good_vi, _ = _vs_indices(1, 4)
    want = rf"slash_indices: expected shape \[B=1, H=4, NS\], got \({B_idx}, {H_idx}, 1\)"
    with pytest.raises(ValueError, match=want):
        vertical_slash_attention(q, k, v, good_vi, si, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "field,make,exc,match",
    [
        pytest.param(
            "range_count",
            lambda ix: ix.range_count[:, :2],
            ValueError,
            r"index.range_count: expected shape \[B=1, H=4, NQB=2\], got \(1, 2, 2\)",
            id="count-shape",
        ),
        pytest.param(
            "columns",
            lambda ix: ix.columns.long(),
            TypeError,
            r"index.columns: expected dtype torch.int32, got torch.int64",
            id="columns-dtype",
        ),
        pytest.param(
            "range_count",
            lambda ix: ix.range_count + 7,
            ValueError,
            r"index.range_count: counts \(at most the width R=\d+\) must lie in \[0, \d+\), "
            r"got values in \[\d+, \d+\]",
            id="count-above-width",
        ),
        pytest.param(
            "columns",
            lambda ix: ix.columns + 10**6,
            ValueError,
            r"index.columns: listed key columns must lie in \[0, 128\), got values in "
            r"\[1000003, 1000040\]",
            id="column-past-the-end",
        ),
        pytest.param(
            "range_start",
            lambda ix: ix.range_start - 5,
            ValueError,
            r"index.range_start: listed key-block starts must lie in \[0, 2\), got values in "
            r"\[-5, -?\d+\]",
            id="negative-range",
        ),
    ],
)
def test_vertical_slash_prebuilt_index_is_checked(field, make, exc, match, impl):
    q, k, v = make_qkv(1, 4, 2, 128, 128, 32, dtype=torch.float16, device=DEV)
    vi, si = _vs_indices(1, 4)
    index = build_vertical_slash_index(vi, si, seq_len=128)
    bad = dataclasses.replace(index, **{field: make(index)})
    with pytest.raises(exc, match=match):
        vertical_slash_attention(q, k, v, vi, si, impl=impl, index=bad)


@pytest.mark.parametrize("impl", IMPLS)
def test_vertical_slash_indices_checked_beside_a_prebuilt_index(impl):
    # The reference reads the indices, the kernel the index: both are checked.
    q, k, v = make_qkv(1, 4, 2, 128, 128, 32, dtype=torch.float16, device=DEV)
    vi, si = _vs_indices(1, 4)
    index = build_vertical_slash_index(vi, si, seq_len=128)
    bad = vi.clone()
    bad[..., -1] = 500
    want = r"vertical_indices: entries must lie in \[0, 128\) \(S = seq_len\), got \[3, 500\]"
    with pytest.raises(ValueError, match=want):
        vertical_slash_attention(q, k, v, bad, si, impl=impl, index=index)


# ------------------------------------------------------------------------------------------
# References in float32: an fp16 score above 65504 stays finite


def _big_scores(S_Q: int = 128, S_KV: int = 128, D: int = 16):
    """fp16 q, k whose raw scores q.k reach about 9e4 (past fp16's 65504), and a scale that
    brings them back to a softmax of moderate sharpness."""
    q, k, v = make_qkv(1, 2, 1, S_Q, S_KV, D, dtype=torch.float16, device=DEV, seed=11)
    q[..., 0] = 300.0
    k[..., 0] = 300.0
    return q, k, v, 1e-4


def _run_op(op: str, q, k, v, *, impl: str, scale=None, **kw):
    S = q.shape[2]
    if op == "attention":
        return attention(q, k, v, scale=scale, impl=impl)
    if op == "block_sparse":
        nb = -(-S // 64)
        sel = torch.ones(1, 1, nb, nb, dtype=torch.bool, device=q.device)
        return block_sparse_attention(
            q, k, v, BlockMask.from_kv_blocks(*_lists(sel), BLOCK_SIZE=(64, 64)),
            scale=scale, impl=impl,
        )  # fmt: skip
    if op == "vertical_slash":
        B, H = q.shape[:2]
        vi = torch.tensor([0, 5], dtype=torch.int32, device=q.device).expand(B, H, 2)
        si = torch.tensor([0], dtype=torch.int32, device=q.device).expand(B, H, 1)
        return vertical_slash_attention(q, k, v, vi, si, scale=scale, impl=impl)
    return triangle_attention(q, k, v, sink=4, window=16, last=8, scale=scale, impl=impl)


def _gold(op: str, q, k, v, scale):
    f64 = torch.float64
    if op == "attention":
        return attention_reference(q, k, v, scale=scale, compute_dtype=f64)
    if op == "block_sparse":
        return attention_reference(q, k, v, scale=scale, compute_dtype=f64)  # all blocks listed
    if op == "vertical_slash":
        B, H = q.shape[:2]
        vi = torch.tensor([0, 5], dtype=torch.int32, device=q.device).expand(B, H, 2)
        si = torch.tensor([0], dtype=torch.int32, device=q.device).expand(B, H, 1)
        return vertical_slash_attention_reference(q, k, v, vi, si, scale=scale, compute_dtype=f64)
    return triangle_attention_reference(
        q, k, v, sink=4, window=16, last=8, scale=scale, compute_dtype=f64
    )


OPS = ["attention", "block_sparse", "vertical_slash", "triangle"]


@pytest.mark.parametrize("impl", [*IMPLS, "auto"])
@pytest.mark.parametrize("op", OPS)
def test_fp16_scores_past_65504_stay_finite(op, impl):
    q, k, v, scale = _big_scores()
    res = _run_op(op, q, k, v, impl=impl, scale=scale)
    gold = _gold(op, q, k, v, scale)
    assert res.out.dtype == torch.float16 and res.lse.dtype == torch.float32
    assert bool(torch.isfinite(res.out).all()) and bool(torch.isfinite(res.lse).all())
    torch.testing.assert_close(res.out.double(), gold.out.double(), atol=3e-3, rtol=0)
    torch.testing.assert_close(res.lse.double(), gold.lse.double(), atol=1e-3, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# Scale and head dim


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scale", [math.inf, -math.inf, math.nan, 0.0], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_scale_must_be_finite_and_positive(op, scale, impl):
    q, k, v = make_qkv(1, 2, 1, 128, 128, 16, dtype=torch.float16, device=DEV)
    with pytest.raises(
        ValueError, match=rf"scale: expected a finite positive float .*, got {scale}"
    ):
        _run_op(op, q, k, v, impl=impl, scale=scale)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", OPS)
def test_scale_past_float32_is_a_value_error(op, impl):
    # the kernels take the scale as a float32 argument
    q, k, v = make_qkv(1, 2, 1, 128, 128, 16, dtype=torch.float16, device=DEV)
    with pytest.raises(ValueError, match=r"at most 3.403e\+38 \(float32\), got 1e\+300"):
        _run_op(op, q, k, v, impl=impl, scale=1e300)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", OPS)
def test_empty_head_dim_is_a_value_error(op, impl):
    q, k, v = make_qkv(1, 2, 1, 128, 128, 0, dtype=torch.float16, device=DEV)
    with pytest.raises(ValueError, match=r"head dim D: expected at least 1, got D=0"):
        _run_op(op, q, k, v, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_merge_names_the_supported_dtypes(impl):
    outs = [torch.zeros(1, 2, 8, 16, dtype=torch.float64, device=DEV)] * 2
    lses = [torch.zeros(1, 2, 8, device=DEV)] * 2
    want = (
        r"outs\[0\]: expected dtype torch.float16, torch.bfloat16 or torch.float32, "
        r"got torch.float64"
    )
    with pytest.raises(TypeError, match=want):
        merge_attention(outs, lses, impl=impl)


# ------------------------------------------------------------------------------------------
# Non-finite values at keys a row does not attend (the promise in each op's docstring)


def _poison(t: torch.Tensor, key: int) -> torch.Tensor:
    t = t.clone()
    t[:, :, key] = float("nan")
    return t


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_in_an_unlisted_block_cannot_reach_the_output(impl):
    S = 256
    q, k, v = make_qkv(1, 2, 1, S, S, 32, dtype=torch.float16, device=DEV, seed=2)
    sel = torch.eye(4, dtype=torch.bool).expand(1, 2, 4, 4).clone()
    sel[..., 3, 1] = True
    sel[..., 2, 2] = False  # key block 2 (keys 128..191) is listed for no query block
    bm = BlockMask.from_kv_blocks(*_lists(sel.to(DEV)), BLOCK_SIZE=(64, 64))
    clean = block_sparse_attention(q, k, v, bm, impl=impl)
    res = block_sparse_attention(q, _poison(k, 150), _poison(v, 150), bm, impl=impl)
    assert torch.equal(res.out, clean.out) and torch.equal(res.lse, clean.lse)
    # A NaN k at a key above the diagonal of a listed block is masked for the rows before it.
    res = block_sparse_attention(q, _poison(k, 230), v, bm, impl=impl)
    assert torch.equal(res.out[:, :, :230], clean.out[:, :, :230])


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_at_a_key_vertical_slash_never_reads(impl):
    S = 256
    q, k, v = make_qkv(1, 2, 2, S, S, 32, dtype=torch.float16, device=DEV, seed=4)
    vi = torch.zeros(1, 2, 0, dtype=torch.int32, device=DEV)
    si = torch.full((1, 2, 1), 128, dtype=torch.int32, device=DEV)  # reads key blocks 0 and 1
    clean = vertical_slash_attention(q, k, v, vi, si, impl=impl)
    res = vertical_slash_attention(q, _poison(k, 250), _poison(v, 250), vi, si, impl=impl)
    assert torch.equal(res.out, clean.out) and torch.equal(res.lse, clean.lse)


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_outside_sink_and_window_cannot_reach_the_output(impl):
    # 64 queries at positions 448..511 attend keys 0..3 and their 16-key window; the kernel
    # reads the sink tile (keys 0..15) and the window band rounded out to key blocks.
    q, k, v = make_qkv(1, 2, 1, 64, 512, 32, dtype=torch.float16, device=DEV, seed=6)
    kw = dict(sink=4, window=16, last=0, impl=impl)
    clean = triangle_attention(q, k, v, **kw)
    res = triangle_attention(q, _poison(k, 200), _poison(v, 200), **kw)
    assert torch.equal(res.out, clean.out) and torch.equal(res.lse, clean.lse)
    # Key 10 sits in the sink tile that is read, unattended: a NaN k there is masked.
    res = triangle_attention(q, _poison(k, 10), v, **kw)
    assert torch.equal(res.out, clean.out)


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_k_at_a_causally_masked_key(impl):
    S = 100
    q, k, v = make_qkv(1, 2, 1, S, S, 32, dtype=torch.float16, device=DEV, seed=8)
    clean = attention(q, k, v, impl=impl)
    res = attention(q, _poison(k, S - 1), v, impl=impl)
    assert torch.equal(res.out[:, :, : S - 1], clean.out[:, :, : S - 1])
    assert not bool(torch.isfinite(res.out[:, :, S - 1]).any())  # the last row attends it


@pytest.mark.parametrize("impl", IMPLS)
def test_merge_ignores_an_empty_part_whatever_its_out(impl):
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32, dtype=torch.float16, device=DEV, seed=9)
    a = attention(q, k, v, causal=False, impl="reference")
    empty_out = torch.full_like(a.out, float("nan"))
    empty_lse = torch.full_like(a.lse, float("-inf"))
    res = merge_attention([a.out, empty_out], [a.lse, empty_lse], impl=impl)
    assert torch.equal(res.out, a.out) and torch.equal(res.lse, a.lse)


# ------------------------------------------------------------------------------------------
# Flags, sizes and containers of the wrong kind


def _flag_call(op: str, flag: str, value, impl: str):
    q, k, v = make_qkv(1, 2, 1, 80, 80, 16, dtype=torch.float32, device=DEV)
    if op == "attention":
        return attention(q, k, v, impl=impl, **{flag: value})
    if op == "block_sparse":
        sel = torch.ones(1, 1, 2, 2, dtype=torch.bool, device=DEV)
        bm = BlockMask.from_kv_blocks(*_lists(sel), BLOCK_SIZE=(64, 64))
        return block_sparse_attention(q, k, v, bm, impl=impl, **{flag: value})
    if op == "vertical_slash":
        vi, si = _vs_indices(1, 2)
        return vertical_slash_attention(q, k, v, vi, si, impl=impl, **{flag: value})
    idx = torch.arange(2, dtype=torch.int32, device=DEV).expand(1, 1, 2, 2).contiguous()
    cnt = torch.full((1, 1, 2), 2, dtype=torch.int32, device=DEV)
    plan = SparsePlan(
        kv_indices=idx, kv_num_blocks=cnt, block_size=64, seq_lengths=(80, 80), **{flag: value}
    )
    return permuted_block_sparse_attention(q, k, v, plan, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("value", ["False", None, 0], ids=repr)
@pytest.mark.parametrize(
    "op, flag",
    [
        ("attention", "causal"),
        ("block_sparse", "causal"),
        ("block_sparse", "check_indices"),
        ("vertical_slash", "check_indices"),
        ("permuted", "causal"),
    ],
)
def test_flags_must_be_bools(op, flag, value, impl):
    # "False" is truthy and None falsy: either would silently pick a different attended set
    with pytest.raises(TypeError, match=rf"{flag}: expected a bool, got {type(value).__name__}"):
        _flag_call(op, flag, value, impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_triton_on_a_device_it_cannot_run_is_a_value_error(impl):
    q, k, v = (t.to("meta") for t in make_qkv(1, 2, 1, 80, 80, 16, dtype=torch.float32))
    if impl == "reference":  # shapes only: the reference runs on meta tensors
        assert attention(q, k, v, impl=impl).out.shape == q.shape
        return
    with pytest.raises(
        ValueError, match=r"impl='triton' needs CUDA tensors .*, got tensors on meta"
    ):
        attention(q, k, v, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "kw",
    [dict(sink=10**30), dict(window=10**30), dict(last=10**30)],
    ids=["sink", "window", "last"],
)
def test_triangle_sizes_past_the_sequence_select_every_key(kw, impl):
    q, k, v = make_qkv(1, 2, 1, 80, 80, 16, dtype=torch.float32, device=DEV)
    args = {"sink": 4, "window": 16, "last": 8, **kw}
    got = triangle_attention(q, k, v, **args, impl=impl)
    clamped = {n: min(x, 80) for n, x in args.items()}
    low = triangle_attention_reference(q, k, v, **clamped)
    gold = triangle_attention_reference(q, k, v, **clamped, compute_dtype=torch.float64)
    assert_close_budget(got.out, low.out, gold.out, dtype=torch.float32)
    assert_close_budget(got.lse, low.lse, gold.lse, dtype=torch.float32, name="lse")


@pytest.mark.parametrize("impl", IMPLS)
def test_block_sparse_duplicate_names_the_block(impl):
    q, k, v = make_qkv(1, 2, 1, 128, 128, 16, dtype=torch.float32, device=DEV)
    num = torch.tensor([[[2, 2]]], dtype=torch.int32, device=DEV)
    idx = torch.tensor([[[[0, 1], [1, 1]]]], dtype=torch.int32, device=DEV)
    bm = BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=64, compute_q_blocks=False)
    with pytest.raises(ValueError, match=r"got kv block 1 listed 2 times for query block 1"):
        block_sparse_attention(q, k, v, bm, impl=impl)


@pytest.mark.parametrize("block", [64.0, True], ids=repr)
def test_vertical_slash_block_sizes_must_be_ints(block):
    vi, si = _vs_indices(1, 2)
    with pytest.raises(TypeError, match=rf"block_m: expected an int in \(64, 128\), got {block!r}"):
        build_vertical_slash_index(vi, si, seq_len=80, block_m=block)


def test_vertical_slash_index_seq_len_is_bounded_by_int32():
    vi, si = _vs_indices(1, 2)
    with pytest.raises(
        ValueError, match=r"seq_len: expected an int in \[1, 2\*\*31\), got 2147483648"
    ):
        build_vertical_slash_index(vi, si, seq_len=2**31)


def test_vertical_slash_index_devices_checked_before_contents():
    vi, si = _vs_indices(1, 2)
    with pytest.raises(ValueError, match=r"one device, got meta and cpu"):
        build_vertical_slash_index(vi.to("meta"), si.cpu(), seq_len=80)


@pytest.mark.parametrize("impl", IMPLS)
def test_merge_takes_sequences_only(impl):
    outs = [torch.zeros(1, 2, 8, 16, device=DEV)]
    lses = [torch.zeros(1, 2, 8, device=DEV)]
    with pytest.raises(
        TypeError, match=r"expected sequences \(list/tuple\) of tensors, got outs of type generator"
    ):
        merge_attention((o for o in outs), lses, impl=impl)


def _grid_order(S: int, stride: int, phase: int) -> torch.Tensor:
    return torch.tensor(sorted(range(S), key=lambda i: ((i - phase) % stride, i)))


@pytest.mark.parametrize(
    "stride, phase, impl",
    [
        *((st, ph, impl) for st, ph in [(80, 7), (81, 3), (500, 90)] for impl in IMPLS),
        (2**40, 7, "reference"),
        (2**40, 2**41 + 5, "reference"),
    ],
    ids=str,
)
def test_grid_permutation_stride_past_the_sequence(stride, phase, impl):
    # the reference's line table is S + 1 entries whatever the stride (2**40 would need 8 TiB)
    p = grid_permutation(80, stride, phase, impl=impl, device=DEV)
    want = _grid_order(80, stride, phase)
    assert torch.equal(p.perm[0].cpu().long(), want)
    assert torch.equal(p.inverse[0].cpu().long(), torch.argsort(want))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (
            dict(stride=10**30),
            ValueError,
            r"stride: expected an int64 value, got an int of 100 bits",
        ),
        (dict(stride=7, phase=-(10**30)), ValueError, r"phase: expected an int64 value"),
        (dict(stride=torch.tensor([], dtype=torch.int64)), ValueError, r"H >= 1, got shape \(0,\)"),
    ],
    ids=["stride-huge", "phase-huge", "stride-empty"],
)
def test_grid_permutation_bad_head_vectors(kw, exc, match, impl):
    with pytest.raises(exc, match=match):
        grid_permutation(80, impl=impl, **kw)


def test_grid_permutation_offsets_narrower_than_a_stride():
    offsets = torch.zeros(1, 3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match=r"at most the offsets' width W=2"):
        grid_permutation(80, 7, offsets=offsets, impl="reference")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "shape_q, shape_k, match",
    [
        ((1, 2, 8, 0), (1, 1, 80, 0), r"head dim D >= 1, got shape \(1, 2, 8, 0\)"),
        ((0, 2, 8, 16), (0, 1, 80, 16), r"B >= 1 .*, got shape \(0, 2, 8, 16\)"),
    ],
    ids=["D0", "B0"],
)
def test_line_scores_empty_dims(shape_q, shape_k, match, impl):
    q_rows, k = torch.randn(shape_q, device=DEV), torch.randn(shape_k, device=DEV)
    with pytest.raises(ValueError, match=match):
        line_scores(q_rows, k, 72, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_line_folds_period_past_the_sequence(impl):
    # the folds are [B, H, period]: a period of 10**12 would allocate terabytes of zeros
    q_rows, k = torch.randn(1, 2, 8, 16, device=DEV), torch.randn(1, 1, 80, 16, device=DEV)
    with pytest.raises(ValueError, match=r"period: expected >= 1 and at most S=80, got 10{12}"):
        line_folds(q_rows, k, 72, period=10**12, lo=0, hi=80, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_grid_permutation_length_fits_int32(impl):
    # the reference would otherwise build 2**31-entry int64 tables before the int32 cast
    with pytest.raises(
        ValueError, match=r"S: expected an int in \[1, 2\*\*31\) .*, got 2147483648"
    ):
        grid_permutation(2**31, 7, impl=impl)
