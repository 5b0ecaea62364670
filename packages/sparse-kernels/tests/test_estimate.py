import pytest
import torch
from sparse_kernels.estimate import (
    column_mass,
    column_mass_reference,
    line_folds,
    line_folds_reference,
    line_scores,
    line_scores_reference,
)
from sparse_kernels.grid_index import GridIndexSettings
from sparse_kernels.testing import assert_close_budget, default_device, kernel_dtypes, make_qkv

DEV = default_device()
# Sums of up to 128 probabilities in float32: a few ulps of the largest sum.
FLOOR = 1e-4

# (B, H, H_KV, L, S, D, row_start)
CASES = [
    pytest.param(1, 2, 2, 64, 300, 64, 236, id="last64-S300"),
    pytest.param(2, 4, 1, 16, 130, 32, 114, id="B2-gqa4-L16"),
    pytest.param(2, 6, 2, 16, 150, 32, 134, id="B2-HKV2-gqa3"),
    pytest.param(1, 3, 1, 10, 200, 80, 57, id="L10-D80-middle-rows"),
    pytest.param(1, 2, 2, 64, 64, 16, 0, id="rows-are-all"),
    pytest.param(1, 2, 1, 1, 97, 64, 96, id="L1"),
    pytest.param(1, 2, 2, 128, 400, 64, 272, id="L128"),
]


def _check(B, H, H_KV, L, S, D, row_start, dtype):
    q, k, _ = make_qkv(B, H, H_KV, S, S, D, dtype=dtype, device=DEV, seed=S + L)
    q_rows = q[:, :, row_start : row_start + L]  # a view, not a copy
    vert, slash = line_scores(q_rows, k, row_start, impl="triton")
    gold = line_scores_reference(q_rows, k, row_start, scale=D**-0.5, compute_dtype=torch.float64)
    low = line_scores_reference(q_rows, k, row_start, scale=D**-0.5)
    assert_close_budget(vert, low[0], gold[0], floor=FLOOR, name="vertical")
    assert_close_budget(slash, low[1], gold[1], floor=FLOOR, name="slash")
    # Each row is a distribution: both views hold exactly L of mass, none past the last row.
    assert torch.allclose(vert.sum(-1), torch.full_like(vert[..., 0], L), rtol=1e-4)
    assert torch.allclose(slash.sum(-1), torch.full_like(slash[..., 0], L), rtol=1e-4)
    assert not bool(vert[..., row_start + L :].any())
    assert not bool(slash[..., row_start + L :].any())


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize("B, H, H_KV, L, S, D, row_start", CASES)
def test_line_scores_matches_reference(B, H, H_KV, L, S, D, row_start, dtype):
    _check(B, H, H_KV, L, S, D, row_start, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_line_scores_qwen_shape_gpu(dtype):
    _check(1, 28, 4, 64, 20000, 128, 20000 - 64, dtype)


def test_reference_matches_definition():
    """The reference against a direct per-element evaluation of the two sums."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 12, 8, generator=g, dtype=torch.float64)
    vert, slash = line_scores_reference(q, k, 6, scale=0.5, compute_dtype=torch.float64)
    for h in range(2):
        p = torch.zeros(5, 12, dtype=torch.float64)
        for lrow in range(5):
            r = 6 + lrow
            s = (q[0, h, lrow] @ k[0, 0, : r + 1].T) * 0.5
            p[lrow, : r + 1] = torch.softmax(s, -1)
        want_v = p.sum(0)
        want_s = torch.zeros(12, dtype=torch.float64)
        for lrow in range(5):
            for j in range(6 + lrow + 1):
                want_s[6 + lrow - j] += p[lrow, j]
        assert torch.allclose(vert[0, h].double(), want_v, atol=1e-6)
        assert torch.allclose(slash[0, h].double(), want_s, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(row_start=-1), ValueError, "row_start"),
        (dict(row_start=90), ValueError, "row_start \\+ L <= S"),
        (dict(row_start=1.0), TypeError, "row_start: expected an int"),
        (dict(q_rows=torch.randn(1, 2, 200, 16)), ValueError, "1 <= L <= 128"),
        (dict(q_rows=torch.randn(1, 3, 8, 16)), ValueError, "H % H_KV"),
        (dict(q_rows=torch.randn(1, 2, 8, 32)), ValueError, "D=32"),
        (dict(q_rows=torch.randn(1, 2, 8, 16).double()), TypeError, "float64"),
        (dict(q_rows=torch.randn(2, 8, 16)), ValueError, "4-D"),
        (dict(impl="fast"), ValueError, "impl must be one of"),
    ],
)
def test_line_scores_bad_input(kwargs, exc, match):
    args = dict(q_rows=torch.randn(1, 2, 8, 16), k=torch.randn(1, 2, 96, 16), row_start=88)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        line_scores(args.pop("q_rows"), args.pop("k"), args.pop("row_start"), **args)


# (B, H, H_KV, L, S, D)
COLUMN_CASES = [
    pytest.param(1, 2, 2, 64, 300, 64, id="L64-S300"),
    pytest.param(2, 4, 1, 16, 130, 32, id="B2-gqa4"),
    pytest.param(1, 6, 2, 5, 97, 80, id="gqa3-D80-odd"),
    pytest.param(1, 2, 1, 200, 150, 32, id="L200-two-passes"),
]


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize("B, H, H_KV, L, S, D", COLUMN_CASES)
def test_column_mass_matches_reference(B, H, H_KV, L, S, D, dtype):
    q, k, _ = make_qkv(B, H, H_KV, L, S, D, dtype=dtype, device=DEV, seed=S + L)
    got = column_mass(q, k, impl="triton")
    gold = column_mass_reference(q, k, scale=D**-0.5, compute_dtype=torch.float64)
    low = column_mass_reference(q, k, scale=D**-0.5)
    assert got.dtype == torch.float32 and got.shape == (B, H, S)
    assert_close_budget(got, low, gold, floor=FLOOR * max(1, L // 128 + 1), name="columns")
    # every row is a distribution over all S keys: L of mass per head
    assert torch.allclose(got.sum(-1), torch.full_like(got[..., 0], L), rtol=1e-4)


def test_column_mass_reference_matches_definition():
    """Rows after every key: each row's softmax over all keys, summed over rows."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 3, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 9, 8, generator=g, dtype=torch.float64)
    got = column_mass_reference(q, k, scale=0.5, compute_dtype=torch.float64)
    for h in range(4):
        want = sum(torch.softmax((q[0, h, r] @ k[0, h // 2].T) * 0.5, -1) for r in range(3))
        assert torch.allclose(got[0, h].double(), want, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_column_mass_qwen_shape_gpu(dtype):
    """Spava's query block (128 rows) over a 20000-key block, Qwen2.5-VL-7B's heads."""
    q, k, _ = make_qkv(1, 28, 4, 128, 20000, 128, dtype=dtype, device=DEV, seed=1)
    got = column_mass(q, k, impl="triton")
    gold = column_mass_reference(q, k, scale=128**-0.5, compute_dtype=torch.float64)
    low = column_mass_reference(q, k, scale=128**-0.5)
    assert_close_budget(got, low, gold, floor=FLOOR, name="columns")


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(q_rows=torch.randn(1, 2, 0, 16)), ValueError, "at least one query row"),
        (dict(k=torch.randn(1, 2, 0, 16)), ValueError, "one key, got L=8 rows and S=0"),
        (dict(q_rows=torch.randn(1, 3, 8, 16)), ValueError, "H % H_KV"),
        (dict(q_rows=torch.randn(1, 2, 8, 32)), ValueError, "D=32"),
        (dict(q_rows=torch.randn(1, 2, 8, 16).double()), TypeError, "float64"),
        (dict(scale=0.0), ValueError, "scale"),
        (dict(impl="fast"), ValueError, "impl must be one of"),
    ],
)
def test_column_mass_bad_input(kwargs, exc, match):
    args = dict(q_rows=torch.randn(1, 2, 8, 16), k=torch.randn(1, 2, 96, 16))
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        column_mass(args.pop("q_rows"), args.pop("k"), **args)


@pytest.mark.gpu
def test_line_scores_offsets_past_int32_gpu():
    """Head offsets of ``q`` past 2**31 elements (a 1M-token, 28-head layer has them): the row
    views of a huge tensor must give the same sums as a compact copy."""
    big = torch.empty(1, 3, 2**30 // 16 + 64, 16, dtype=torch.float16, device=DEV)
    q_rows = big[:, :, :64]
    assert q_rows.stride(1) * 2 >= 2**31
    g = torch.Generator(device="cpu").manual_seed(0)
    q_rows.copy_(torch.randn(1, 3, 64, 16, generator=g).to(DEV, torch.float16))
    k = torch.randn(1, 1, 300, 16, generator=g).to(DEV, torch.float16)
    got = line_scores(q_rows, k, 236, impl="triton")
    want = line_scores(q_rows.contiguous(), k, 236, impl="triton")
    del big, q_rows
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
def test_every_candidate_config_is_correct():
    """Each candidate launch config of pass 2 on its own (a tuned table may name any)."""
    from sparse_kernels.estimate import triton as est

    q, k, _ = make_qkv(1, 4, 2, 5000, 5000, 128, dtype=torch.bfloat16, device=DEV, seed=9)
    q_rows = q[:, :, -64:]
    low = line_scores_reference(q_rows, k, 5000 - 64, scale=128**-0.5)
    gold = line_scores_reference(q_rows, k, 5000 - 64, scale=128**-0.5, compute_dtype=torch.float64)
    for cfg in est.SPEC.candidates:
        vert, slash = est.line_scores_triton(q_rows, k, 5000 - 64, scale=128**-0.5, config=cfg)
        assert_close_budget(vert, low[0], gold[0], floor=FLOOR, name=f"vertical {cfg}")
        assert_close_budget(slash, low[1], gold[1], floor=FLOOR, name=f"slash {cfg}")


# (B, H, H_KV, L, S, D, row_start, period, lo, hi, block_n)
FOLD_CASES = [
    pytest.param(1, 2, 2, 64, 300, 64, 236, 16, 16, 288, 64, id="last64-S300-P16-periods-per-tile"),
    pytest.param(2, 4, 1, 16, 130, 32, 114, 5, 3, 125, 16, id="B2-gqa4-P5-window-off-periods"),
    pytest.param(1, 3, 1, 10, 200, 32, 57, 32, 0, 200, 16, id="L10-middle-rows-P32-two-subtiles"),
    pytest.param(1, 2, 2, 64, 600, 64, 536, 100, 100, 600, 64, id="P100-ragged-last-subtile"),
    pytest.param(1, 2, 1, 1, 97, 16, 96, 7, 7, 91, 16, id="L1-P7"),
    pytest.param(1, 2, 2, 16, 500, 16, 484, 48, 48, 480, 32, id="P48-one-period-per-tile"),
    pytest.param(1, 2, 2, 16, 200, 16, 184, 16, 50, 50, 16, id="empty-window"),
    pytest.param(1, 2, 2, 16, 64, 16, 48, 128, 0, 64, 16, id="period-past-S"),
    pytest.param(1, 2, 2, 16, 64, 16, 48, 1000, 0, 64, 16, id="period-far-past-S-capped-subtiles"),
    pytest.param(2, 2, 1, 20, 300, 32, 280, 12, 12, 288, 32, id="B2-L20-two-row-groups"),
    pytest.param(1, 2, 1, 128, 400, 32, 272, 24, 24, 384, None, id="L128-default-tile"),
    pytest.param(1, 4, 2, 16, 700, 32, 684, 32, 32, 672, 16, id="P32-many-interior-segments"),
]


def _check_folds(B, H, H_KV, L, S, D, row_start, period, lo, hi, block_n, dtype, **launch):
    from sparse_kernels.grid_index.fold_launch import line_folds_triton

    q, k, _ = make_qkv(B, H, H_KV, S, S, D, dtype=dtype, device=DEV, seed=S + L + period)
    q_rows = q[:, :, row_start : row_start + L]
    got = line_folds_triton(
        q_rows, k, row_start, period=period, lo=lo, hi=hi, scale=D**-0.5, block_n=block_n, **launch
    )
    kw = dict(lo=lo, hi=hi, scale=D**-0.5)
    gold = line_folds_reference(
        q_rows, k, row_start, period=period, **kw, compute_dtype=torch.float64
    )
    low = line_folds_reference(q_rows, k, row_start, period=period, **kw)
    assert got[0].shape == got[1].shape == (B, H, period)
    assert_close_budget(got[0], low[0], gold[0], floor=FLOOR, name="vertical fold")
    assert_close_budget(got[1], low[1], gold[1], floor=FLOOR, name="slash fold")


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize("B, H, H_KV, L, S, D, row_start, period, lo, hi, block_n", FOLD_CASES)
def test_line_folds_matches_reference(
    B, H, H_KV, L, S, D, row_start, period, lo, hi, block_n, dtype
):
    _check_folds(B, H, H_KV, L, S, D, row_start, period, lo, hi, block_n, dtype)


@pytest.mark.parametrize("programs", [1, 3, 7])
def test_line_folds_with_several_segments_per_program(programs):
    """Few programs: each walks many segments, and partials of the same sub-tile are merged
    across chunks (at test sizes the default split gives every program one segment)."""
    settings = GridIndexSettings(fold_programs=programs)
    _check_folds(2, 2, 1, 16, 700, 32, 684, 24, 24, 696, 16, torch.float32, settings=settings)
    # interior chunks
    _check_folds(2, 2, 1, 16, 700, 32, 684, 32, 32, 672, 16, torch.float32, settings=settings)


def test_line_folds_interior_kernel_takes_exactly_the_inside_segments():
    """``interior_segments`` against the kernel's per-tile ``inside`` test, evaluated here for every
    segment and sub-tile: [g_a, g_b) holds the segments all of whose tiles are inside (the
    widest such run), and the folds agree with the interior kernel off."""
    from sparse_kernels.grid_index.fold_launch import fold_plan, interior_segments

    for L, S, row_start, P, lo, hi, bn in [
        (16, 700, 684, 32, 32, 672, 16), (64, 300, 236, 16, 16, 288, 64),
        (16, 200, 184, 16, 50, 50, 16), (16, 700, 300, 32, 100, 500, 16),
    ]:  # fmt: skip
        seg, n_sub, n_seg, _, _ = fold_plan(P, min(S, row_start + L), 2, bn, 1024, 262144)
        g_a, g_b = interior_segments(seg, n_sub, bn, L, 16 if L <= 16 else 64, row_start, lo, hi)
        last_row = row_start + L - 1
        full = []
        for g in range(n_seg):
            j0 = [g * seg + t * bn for t in range(n_sub)]
            if all(
                j >= lo and j + bn <= hi and j + bn - 1 <= row_start - lo
                and j > last_row - hi and seg - t * bn >= bn
                for t, j in enumerate(j0)
            ):  # fmt: skip
                full.append(g)
        assert list(range(g_a, g_b)) == full, (L, S, P, g_a, g_b, full)
    _check_folds(1, 4, 2, 16, 700, 32, 684, 32, 32, 672, 16, torch.float16)
    no_interior = GridIndexSettings(fold_interior=False)
    _check_folds(1, 4, 2, 16, 700, 32, 684, 32, 32, 672, 16, torch.float16, settings=no_interior)


@pytest.mark.parametrize("heads", [1, 2, 4], ids=lambda h: f"hp{h}")
def test_line_folds_interior_kernel_shares_key_tiles_across_query_heads(heads):
    """The interior kernel with ``heads`` query heads of a KV group per program: groups of 3
    (the last slot's rows past the group masked), 2 KV heads, 2 batch rows, against the
    reference; and the default (two heads per program up to ``fold_short_keys`` keys, then
    one)."""
    from sparse_kernels.grid_index.fold_launch import fold_setup

    settings = GridIndexSettings(fold_heads=heads)
    _check_folds(2, 6, 2, 16, 700, 32, 684, 32, 32, 672, 16, torch.float16, settings=settings)
    f = fold_setup(2, 6, 2, 16, 32, 700, 684, 32, 32, 672, False, 16, None, None, True,
                        True, 1024, 262144, heads)  # fmt: skip
    assert f.edges and f.meta_i["HP"] == heads
    assert f.grid_i[1] == 4 and f.n_int_progs % -(-3 // heads) == 0
    f = fold_setup(2, 6, 2, 16, 32, 700, 684, 32, 32, 672, False, 16, None, None, True,
                        True, 1024, 262144, 0)  # fmt: skip
    assert f.meta_i["HP"] == 2  # the default up to fold_short_keys keys
    f = fold_setup(2, 6, 2, 16, 32, 700, 684, 32, 32, 672, False, 16, None, None, True,
                        True, 1024, 600, 0)  # fmt: skip
    assert f.meta_i["HP"] == 1  # and past it


@pytest.mark.parametrize(
    "L, S, row_start, P, lo, hi, bn",
    [
        pytest.param(16, 700, 684, 32, 32, 672, 16, id="interior-and-edges"),
        pytest.param(16, 300, 280, 12, 12, 288, 32, id="edges-only"),
    ],
)
@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
def test_line_folds_read_q_and_k_at_device_offsets(L, S, row_start, P, lo, hi, bn, dtype):
    """With ``qk_offsets`` the fold kernel reads the rows and keys of other tensors than the
    ones it is launched with (what a CUDA graph replay does): the partials equal those of a
    launch on those tensors, bit for bit, for the one-launch kernel and the all-edge one."""
    from sparse_kernels.grid_index.fold_launch import fold_partials

    B, H, H_KV, D = 1, 4, 2, 32
    q, k, _ = make_qkv(B, H, H_KV, S, S, D, dtype=dtype, device=DEV, seed=S + L)
    q2, k2, _ = make_qkv(B, H, H_KV, S, S, D, dtype=dtype, device=DEV, seed=S + L + 1)
    # One storage per pair, 16-byte aligned offsets between the launched and the read tensors.
    qs = torch.zeros(2, *q.shape, dtype=dtype, device=DEV)
    ks = torch.zeros(2, *k.shape, dtype=dtype, device=DEV)
    qs[0], qs[1], ks[0], ks[1] = q, q2, k, k2
    rows = lambda t: t[:, :, row_start : row_start + L]  # noqa: E731
    kw = dict(period=P, lo=lo, hi=hi, scale=D**-0.5, block_n=bn)
    want = fold_partials(rows(qs[1]), ks[1], row_start, **kw)
    es = q.element_size()
    offs = torch.tensor(
        [(qs[1].data_ptr() - qs[0].data_ptr()) // es, (ks[1].data_ptr() - ks[0].data_ptr()) // es]
    ).to(DEV)
    got = fold_partials(rows(qs[0]), ks[0], row_start, **kw, qk_offsets=offs)
    assert got[2] == want[2]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    other = fold_partials(rows(qs[0]), ks[0], row_start, **kw)
    assert not torch.equal(other[0], want[0])  # the offsets moved the reads
    with pytest.raises(ValueError, match="expected int64 \\[2\\], got torch.int32"):
        fold_partials(rows(qs[0]), ks[0], row_start, **kw, qk_offsets=offs.int())
    with pytest.raises(ValueError, match="unit last strides"):
        fold_partials(
            rows(qs[0]).transpose(2, 3).contiguous().transpose(2, 3), ks[0], row_start, **kw,
            qk_offsets=offs,
        )  # fmt: skip


def test_line_folds_reference_is_the_fold_of_line_scores():
    """The folds' reference against a direct per-position sum of the line scores' reference."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 40, 8, generator=g, dtype=torch.float64)
    vert, slash = line_scores_reference(q, k, 34, scale=0.5, compute_dtype=torch.float64)
    col, sl = line_folds_reference(
        q, k, 34, period=6, lo=5, hi=37, scale=0.5, compute_dtype=torch.float64
    )
    for c in range(6):
        pos = [p for p in range(5, 37) if p % 6 == c]
        assert torch.allclose(col[..., c].double(), vert[..., pos].sum(-1).double(), atol=1e-6)
        assert torch.allclose(sl[..., c].double(), slash[..., pos].sum(-1).double(), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(period=0), ValueError, "period: expected >= 1"),
        (dict(period=2.0), TypeError, "period: expected an int"),
        (dict(lo=-1), ValueError, "0 <= lo <= hi <= S=96"),
        (dict(hi=97), ValueError, "0 <= lo <= hi <= S=96"),
        (dict(lo=50, hi=40), ValueError, "got lo=50, hi=40"),
        (dict(row_start=90), ValueError, "row_start \\+ L <= S"),
        (dict(q_rows=torch.randn(1, 3, 8, 16)), ValueError, "H % H_KV"),
        (dict(impl="fast"), ValueError, "impl must be one of"),
    ],
)
def test_line_folds_bad_input(kwargs, exc, match):
    args = dict(
        q_rows=torch.randn(1, 2, 8, 16), k=torch.randn(1, 2, 96, 16), row_start=88, period=8,
        lo=8, hi=88,
    )  # fmt: skip
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        line_folds(args.pop("q_rows"), args.pop("k"), args.pop("row_start"), **args)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("block_n", [None, 64, 128], ids=lambda b: f"bn{b}")
@pytest.mark.parametrize("num_warps", [4, 8], ids=lambda w: f"w{w}")
def test_line_folds_qwen_shape_every_launch_setting_gpu(dtype, block_n, num_warps):
    """Qwen2.5-VL-7B heads, 20000 keys, tokens-per-frame 256 and a ragged 324: each tile width
    and warp count the tuning script tries is correct."""
    for period in (256, 324):
        S = 20000
        _check_folds(1, 28, 4, 64, S, 128, S - 64, period, period, S // period * period,
                     block_n, dtype, num_warps=num_warps)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize(
    "L, dtype",
    [(128, torch.bfloat16), (100, torch.float16), (64, torch.float32), (128, torch.float32)],
    ids=str,
)
def test_line_folds_default_settings_gpu(L, dtype):
    """The default launch for 128-row blocks (64-wide tiles, 8 warps) and for fp32 (exact dots,
    narrow tiles)."""
    S = 6000
    _check_folds(1, 8, 2, L, S, 128, S - L, 256, 256, S // 256 * 256, None, dtype)


# (P, strides, n_g, seg, seg_w, L, row_start): merged partials of every layout the fold kernel
# makes (several periods per segment, a ragged last sub-tile, sub-tiles past the last key).
SEARCH_PARTIAL_CASES = [
    pytest.param(16, (2, 4, 8, 16), 4, 64, 64, 64, 236, id="P16-four-periods-per-segment"),
    pytest.param(12, (2, 3, 4, 6, 12), 1, 12, 16, 16, 114, id="P12-ragged-subtile"),
    pytest.param(130, (2, 5, 10, 13, 26, 65, 130), 2, 130, 192, 20, 7, id="P130-two-row-groups"),
    pytest.param(256, (2, 4, 8, 16, 32, 64, 128, 256), 4, 256, 256, 64, 131008, id="P256-qwen"),
    pytest.param(100, (100,), 1, 100, 64, 16, 33, id="one-stride-subtiles-past-the-keys"),
]


@pytest.mark.parametrize("P, strides, n_g, seg, seg_w, L, row_start", SEARCH_PARTIAL_CASES)
def test_fold_search_kernel_matches_the_torch_search_of_the_same_partials(
    P, strides, n_g, seg, seg_w, L, row_start
):
    """``_fold_search_kernel`` against ``search_folds_reference`` of ``fold_tail`` (the torch
    folds) on the same merged partials: strides and phases exact, scores to float rounding. Half
    the heads carry a planted class so that the chosen strides are not all the smallest."""
    from sparse_kernels.estimate.search import host_to_device, search_folds_reference
    from sparse_kernels.grid_index.fold_launch import fold_tail
    from sparse_kernels.grid_index.search_triton import search_partials

    g = torch.Generator().manual_seed(P + L)
    BH = 6
    col = torch.rand(BH, n_g, seg_w, generator=g)
    sl = torch.rand(BH, L, seg_w, generator=g)
    pos = torch.arange(seg_w)
    for h, s in zip(range(0, BH, 2), strides[::2]):
        col[h, :, pos % s == h % s] += 3.0
        sl[h, :, pos % s == 1 % s] += 3.0
    col, sl = col.to(DEV), sl.to(DEV)
    cf, sf = fold_tail(col, sl, seg, P, row_start)
    want = search_folds_reference(cf, sf, strides, rel_tol=0.15)
    sv = host_to_device(torch.tensor(strides, dtype=torch.int32), DEV)
    got = search_partials(col, sl, seg, P, row_start, sv, 0.15)
    assert torch.equal(got[0], want[0]), (got[0], want[0])
    assert torch.equal(got[1], want[1]), (got[1], want[1])
    assert torch.allclose(got[2], want[2], rtol=1e-5)
    # The case chooses between strides (one stride: between phases).
    assert len(set(want[0 if len(strides) > 1 else 1].tolist())) > 1


# (B, H, H_KV, L, S, D, period, strides, planted stride, dtype)
FOLD_SEARCH_CASES = [
    pytest.param(1, 4, 2, 20, 300, 32, 16, [2, 4, 8, 16], 8, torch.float16, id="P16-stride8"),
    pytest.param(2, 2, 1, 16, 257, 32, 12, [2, 3, 4, 6, 12], 6, torch.float32, id="B2-P12"),
    pytest.param(
        1,
        2,
        2,
        64,
        520,
        32,
        130,
        [2, 5, 10, 13, 26, 65, 130],
        65,
        torch.float16,
        id="P130-ragged-subtiles",
    ),  # fmt: skip
    pytest.param(1, 2, 1, 8, 200, 32, 48, [48], 48, torch.float32, id="one-stride"),
]


@pytest.mark.parametrize("B, H, H_KV, L, S, D, period, strides, planted, dtype", FOLD_SEARCH_CASES)
def test_line_fold_search_recovers_a_planted_grid(
    B, H, H_KV, L, S, D, period, strides, planted, dtype
):
    """Keys on the lines ``j = 3 (mod planted)`` get a large logit: the Triton search and the
    reference both find that stride and phase."""
    from sparse_kernels.estimate import line_fold_search

    q, k, _ = make_qkv(B, H, H_KV, S, S, D, dtype=torch.float32, device=DEV, seed=S + L)
    q[..., 0] = 2.0
    k[..., 3::planted, 0] = 4.0
    q, k = q.to(dtype), k.to(dtype)
    kw = dict(period=period, lo=period, hi=S // period * period, strides=strides)
    st, ph, sc = line_fold_search(q[:, :, S - L :], k, S - L, **kw, impl="triton")
    ref = line_fold_search(q[:, :, S - L :], k, S - L, **kw, impl="reference")
    assert st.shape == ph.shape == sc.shape == (B, H)
    assert torch.equal(st, torch.full((B, H), planted, device=DEV))
    assert torch.equal(ph, torch.full((B, H), 3 % planted, device=DEV))
    assert torch.equal(ref[0], st) and torch.equal(ref[1], ph)
    assert torch.allclose(sc, ref[2], rtol=1e-3)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(strides=[]), ValueError, "strides: expected a non-empty list"),
        (dict(strides=[3]), ValueError, "dividing period=8, got \\[3\\]"),
        (dict(strides=[0, 2]), ValueError, "dividing period=8"),
        (dict(strides=[2.0]), ValueError, "dividing period=8"),
        (dict(rel_tol=1.0), ValueError, "rel_tol: expected a float in \\[0, 1\\)"),
        (dict(period=0), ValueError, "period: expected >= 1"),
        (dict(hi=97), ValueError, "0 <= lo <= hi <= S=96"),
        (dict(impl="fast"), ValueError, "impl must be one of"),
    ],
)
def test_line_fold_search_bad_input(kwargs, exc, match):
    from sparse_kernels.estimate import line_fold_search

    args = dict(
        q_rows=torch.randn(1, 2, 8, 16), k=torch.randn(1, 2, 96, 16), row_start=88, period=8,
        lo=8, hi=88, strides=[2, 4, 8],
    )  # fmt: skip
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        line_fold_search(args.pop("q_rows"), args.pop("k"), args.pop("row_start"), **args)
