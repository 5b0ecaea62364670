import pytest
import torch
from sparse_kernels import build_vertical_slash_index, vertical_slash_attention
from sparse_kernels.testing import assert_close_budget, default_device, kernel_dtypes, make_qkv
from sparse_kernels.vertical_slash import vertical_slash_attention_reference, vertical_slash_mask

DEV = default_device()


def make_indices(B, H, S, NV, NS, *, seed=0, local=0, device=DEV):
    """Sorted, distinct random verticals and slashes; ``local`` forces offsets 0..local-1."""
    g = torch.Generator().manual_seed(seed)
    vs, ss = [], []
    for _ in range(B * H):
        vs.append(torch.randperm(S, generator=g)[:NV].sort().values)
        forced = torch.arange(min(local, S))
        rest = torch.randperm(S, generator=g)
        rest = rest[rest >= local][: max(NS - forced.numel(), 0)]
        ss.append(torch.cat([forced, rest])[:NS].sort().values)
    v = torch.stack(vs).reshape(B, H, -1).to(torch.int32).to(device)
    s = torch.stack(ss).reshape(B, H, -1).to(torch.int32).to(device)
    return v, s


def independent_mask(v, s, S, BM, BN):
    """Element diagonals, then tile pooling ("any element of the tile is on a slash")."""
    B, H = v.shape[:2]
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    out = torch.zeros(B, H, S, S, dtype=torch.bool)
    nqb, nkb = -(-S // BM), -(-S // BN)
    for b in range(B):
        for h in range(H):
            diag = torch.isin(i - j, s[b, h].cpu().long())
            pad = torch.zeros(nqb * BM, nkb * BN, dtype=torch.bool)
            pad[:S, :S] = diag
            tiles = pad.reshape(nqb, BM, nkb, BN).any(3).any(1)
            m = tiles[i // BM, j // BN] | torch.isin(j, v[b, h].cpu().long())
            out[b, h] = m & (j <= i)
    return out


SIZES = [
    pytest.param(1, 64, 64, 1, 1, id="S1-b64"),
    pytest.param(97, 64, 64, 5, 3, id="S97-b64"),
    pytest.param(300, 128, 64, 10, 7, id="S300-b128x64"),
    pytest.param(300, 64, 128, 12, 9, id="S300-b64x128"),
    pytest.param(1025, 128, 128, 30, 20, id="S1025-b128"),
    pytest.param(1025, 64, 64, 0, 20, id="S1025-b64-noverticals"),
    pytest.param(400, 64, 64, 20, 0, id="S400-b64-noslashes"),
]


@pytest.mark.parametrize("S,BM,BN,NV,NS", SIZES)
def test_reference_mask_matches_independent_construction(S, BM, BN, NV, NS):
    v, s = make_indices(2, 2, S, NV, NS, seed=S + NV, local=min(NS, 4), device="cpu")
    mask = vertical_slash_mask(v, s, S, block_m=BM, block_n=BN)
    assert torch.equal(mask, independent_mask(v, s, S, BM, BN))


@pytest.mark.parametrize("S,BM,BN,NV,NS", SIZES)
def test_index_executes_exactly_the_mask(S, BM, BN, NV, NS):
    v, s = make_indices(2, 3, S, NV, NS, seed=S + NS, local=min(NS, 4), device="cpu")
    idx = build_vertical_slash_index(v, s, seq_len=S, block_m=BM, block_n=BN)
    assert torch.equal(idx.to_dense(), vertical_slash_mask(v, s, S, block_m=BM, block_n=BN))
    # Ranges merged: ascending, disjoint and non-adjacent; columns outside the ranges, ascending.
    R = idx.range_start.shape[-1]
    valid = torch.arange(R) < idx.range_count[..., None]
    assert bool((idx.range_end > idx.range_start)[valid].all())
    gaps = idx.range_start[..., 1:] > idx.range_end[..., :-1]
    assert bool(gaps[valid[..., 1:]].all())
    C = idx.columns.shape[-1]
    cvalid = torch.arange(C) < idx.column_count[..., None]
    assert bool((idx.columns[..., 1:] > idx.columns[..., :-1])[cvalid[..., 1:]].all())
    tiles = idx.tile_mask()
    col_tiles = torch.gather(tiles, 3, (idx.columns.long() // BN))
    assert not bool(col_tiles[cvalid].any())


@pytest.mark.parametrize("S,BM,BN,NV,NS", SIZES)
def test_range_lists_list_exactly_the_range_tiles(S, BM, BN, NV, NS):
    # The block lists the FA4 engine runs: each query block's range tiles, ascending.
    from sparse_kernels.vertical_slash.lists_triton import _launch_range_lists

    v, s = make_indices(2, 3, S, NV, NS, seed=S + NV + 1, local=min(NS, 4))
    idx = build_vertical_slash_index(v, s, seq_len=S, block_m=BM, block_n=BN)
    num, lists = _launch_range_lists(idx)
    tiles = idx.tile_mask()
    assert torch.equal(num, tiles.sum(-1, dtype=torch.int32))
    nkb, width = tiles.shape[-1], lists.shape[-1]
    assert width == max(int(num.max()), 1)  # as wide as the longest list, not NKB
    want = torch.where(tiles, torch.arange(nkb, device=tiles.device), nkb).sort(-1).values
    listed = torch.arange(width, device=num.device) < num[..., None]
    assert torch.equal(lists[listed], want[..., :width][listed].to(torch.int32))


def test_block_rounding_adds_whole_tiles():
    # One slash (offset 0) at S=256, 64x64 tiles: the diagonal tiles are computed in full
    # (causal), i.e. each row sees its whole key block up to the diagonal, not only itself.
    v = torch.zeros(1, 1, 0, dtype=torch.int32)
    s = torch.zeros(1, 1, 1, dtype=torch.int32)
    mask = vertical_slash_mask(v, s, 256, block_m=64, block_n=64)[0, 0]
    i = torch.arange(256)[:, None]
    j = torch.arange(256)[None, :]
    assert torch.equal(mask, (i // 64 == j // 64) & (j <= i))


def test_to_block_mask_has_the_same_attended_set():
    from sparse_kernels.block_sparse import block_mask_to_dense

    S, BM, BN = 300, 64, 64
    v, s = make_indices(1, 2, S, 9, 6, seed=4, local=3, device="cpu")
    idx = build_vertical_slash_index(v, s, seq_len=S, block_m=BM, block_n=BN)
    bm = idx.to_block_mask()
    listed = block_mask_to_dense(bm, S, S, causal=True)
    b = torch.arange(1)[:, None, None, None]
    h = torch.arange(2)[None, :, None, None]
    qi = torch.arange(S)[None, None, :, None]
    kj = torch.arange(S)[None, None, None, :]
    mod = bm.mask_mod(b, h, qi, kj)
    # Partial blocks evaluate mask_mod, full blocks do not: full blocks must need no mask.
    nkb = -(-S // BN)
    from sparse_kernels.block_sparse.reference import _listed_blocks

    full = _listed_blocks(bm.full_kv_num_blocks, bm.full_kv_indices, nkb)
    full_el = full.repeat_interleave(BM, 2).repeat_interleave(BN, 3)[..., :S, :S]
    flex_set = listed & (mod | full_el)
    assert torch.equal(flex_set, idx.to_dense())


CASES = [
    pytest.param(1, 2, 2, 1, 64, 64, 64, 1, 1, id="S1-D64-b64"),
    pytest.param(1, 4, 1, 97, 64, 64, 64, 5, 8, id="S97-D64-b64-gqa4"),
    pytest.param(1, 7, 1, 300, 128, 128, 64, 10, 7, id="S300-D128-b128x64-gqa7"),
    pytest.param(1, 2, 2, 300, 80, 64, 128, 12, 9, id="S300-D80-b64x128"),
    pytest.param(1, 2, 1, 1025, 64, 64, 64, 40, 70, id="S1025-D64-b64-local64"),
]


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize("B,H,H_KV,S,D,BM,BN,NV,NS", CASES)
def test_vertical_slash_matches_reference(B, H, H_KV, S, D, BM, BN, NV, NS, dtype):
    _run(B, H, H_KV, S, D, BM, BN, NV, NS, dtype)


@pytest.mark.parametrize("tile_n", [16, 32])
def test_key_tiles_smaller_than_the_block(monkeypatch, tile_n):
    # fp32 on the GPU walks 32-key tiles inside 128-key blocks: the same attended set.
    from sparse_kernels.vertical_slash import triton as vs_triton

    monkeypatch.setattr(vs_triton, "_tile_n", lambda dtype, block_n: min(block_n, tile_n))
    _run(1, 2, 2, 300, 80, 64, 128, 12, 9, torch.float32)


def _run(B, H, H_KV, S, D, BM, BN, NV, NS, dtype, seed=0):
    q, k, v = make_qkv(B, H, H_KV, S, S, D, dtype=dtype, device=DEV, seed=seed + S)
    vi, si = make_indices(B, H, S, NV, NS, seed=seed, local=min(NS, 64))
    kw = dict(block_m=BM, block_n=BN)
    res = vertical_slash_attention(q, k, v, vi, si, impl="triton", **kw)
    gold = vertical_slash_attention_reference(q, k, v, vi, si, compute_dtype=torch.float64, **kw)
    low = vertical_slash_attention_reference(q, k, v, vi, si, **kw, compute_dtype=q.dtype)
    assert res.out.shape == q.shape and res.lse.shape == (B, H, S)
    assert_close_budget(res.out, low.out, gold.out, dtype=dtype, name="out")
    assert_close_budget(res.lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")


def test_prebuilt_index_and_empty_rows():
    # No slash, a single vertical at column 50: rows < 50 attend nothing.
    q, k, v = make_qkv(1, 2, 2, 130, 130, 64, dtype=torch.float32, device=DEV, seed=1)
    vi = torch.full((1, 2, 1), 50, dtype=torch.int32, device=DEV)
    si = torch.zeros(1, 2, 0, dtype=torch.int32, device=DEV)
    idx = build_vertical_slash_index(vi, si, seq_len=130)
    res = vertical_slash_attention(q, k, v, vi, si, impl="triton", index=idx)
    assert bool(torch.isneginf(res.lse[..., :50]).all())
    assert torch.equal(res.out[..., :50, :], torch.zeros_like(res.out[..., :50, :]))
    torch.testing.assert_close(res.out[..., 50:, :], v[:, :, 50:51, :].expand(1, 2, 80, 64))


def test_merge_adds_the_columns_and_leaves_blocks_without_columns_untouched():
    # Slash 0 makes the diagonal tiles ranges; vertical 10 lies in block 0's diagonal tile (no
    # leftover column there) and is a leftover column of blocks 1 and 2.
    from sparse_kernels.tuning import LaunchConfig
    from sparse_kernels.vertical_slash.triton import _launch_vertical_slash_fwd

    q, k, v = make_qkv(1, 2, 1, 192, 192, 64, dtype=torch.float32, device=DEV, seed=3)
    vi = torch.full((1, 2, 1), 10, dtype=torch.int32, device=DEV)
    si = torch.zeros(1, 2, 1, dtype=torch.int32, device=DEV)
    kw = dict(block_m=64, block_n=64)
    idx = build_vertical_slash_index(vi, si, seq_len=192, **kw)
    assert idx.column_count.flatten().tolist() == [0, 1, 1] * 2
    ranges = vertical_slash_attention(q, k, v, vi[..., :0], si, impl="triton", scale=0.125, **kw)
    want = vertical_slash_attention(q, k, v, vi, si, impl="triton", scale=0.125, **kw)
    # the looked-up config, then 16 keys per step (the GPU merge's steps are shorter than a block)
    for config in (None, LaunchConfig.of(TILE_N=16, num_warps=4, num_stages=1)):
        out, lse = ranges.out.clone(), ranges.lse.clone()
        out[:, :, :64], lse[:, :, :64] = float("nan"), float("nan")
        _launch_vertical_slash_fwd(q, k, v, idx, scale=0.125, merge_into=(out, lse), config=config)
        assert bool(out[:, :, :64].isnan().all()) and bool(lse[:, :, :64].isnan().all())
        torch.testing.assert_close(out[:, :, 64:], want.out[:, :, 64:])
        torch.testing.assert_close(lse[:, :, 64:], want.lse[:, :, 64:])


def test_key_steps_named_by_the_config_compute_the_same_function():
    # TILE_N: keys per step, a divisor of the index's key block (the merge's config names one).
    from sparse_kernels.tuning import LaunchConfig
    from sparse_kernels.vertical_slash.triton import _launch_vertical_slash_fwd

    q, k, v = make_qkv(1, 2, 1, 200, 200, 64, dtype=torch.float32, device=DEV, seed=4)
    vi, si = make_indices(1, 2, 200, 12, 5, seed=4, device=DEV)
    kw = dict(block_m=64, block_n=64)
    idx = build_vertical_slash_index(vi, si, seq_len=200, **kw)
    gold = vertical_slash_attention_reference(q, k, v, vi, si, compute_dtype=torch.float64, **kw)
    low = vertical_slash_attention_reference(q, k, v, vi, si, **kw)
    for tile_n in (16, 32):
        cfg = LaunchConfig.of(TILE_N=tile_n, num_warps=4, num_stages=1)
        out, lse = _launch_vertical_slash_fwd(q, k, v, idx, scale=0.125, config=cfg)
        assert_close_budget(out, low.out, gold.out, dtype=torch.float32, name=str(cfg))
        assert_close_budget(lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")
    for bad in (dict(TILE_N=48), dict(TILE_N=8), dict(BLOCK_M=64)):
        with pytest.raises(ValueError, match="TILE_N .* is its only tile, got"):
            _launch_vertical_slash_fwd(q, k, v, idx, scale=0.125, config=LaunchConfig.of(**bad))


# ------------------------------------------------------------------------------------------
# Bad input


def _bad(**over):
    q, k, v = make_qkv(1, 2, 1, 100, 100, 64, dtype=torch.float16, device="cpu")
    vi, si = make_indices(1, 2, 100, 4, 3, device="cpu")
    args = dict(q=q, k=k, v=v, vi=vi, si=si)
    args.update(over)
    kw = {k_: args.pop(k_) for k_ in list(args) if k_ not in ("q", "k", "v", "vi", "si")}
    return vertical_slash_attention(
        args["q"], args["k"], args["v"], args["vi"], args["si"], impl="reference", **kw
    )


def test_bad_out_of_range():
    with pytest.raises(ValueError, match=r"vertical_indices: entries must lie in \[0, 100\)"):
        _bad(vi=torch.tensor([[[3, 100]] * 2], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"slash_indices: entries must lie in \[0, 100\)"):
        _bad(si=torch.tensor([[[-1, 3]] * 2], dtype=torch.int32))


def test_bad_unsorted_or_duplicate():
    with pytest.raises(ValueError, match="vertical_indices: each row must be sorted strictly"):
        _bad(vi=torch.tensor([[[5, 3]] * 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="slash_indices: each row must be sorted strictly"):
        _bad(si=torch.tensor([[[3, 3]] * 2], dtype=torch.int32))


def test_index_without_content_checks():
    """``check_contents=False`` skips only the range / order checks (its caller vouches for
    them): the same index on valid indices, no ValueError on unsorted ones; shapes and dtypes
    are still checked."""
    from sparse_kernels.vertical_slash import build_vertical_slash_index

    vi, si = make_indices(1, 2, 300, 6, 5, device="cpu")
    a = build_vertical_slash_index(vi, si, seq_len=300)
    b = build_vertical_slash_index(vi, si, seq_len=300, check_contents=False)
    for f in ("range_count", "range_start", "range_end", "column_count", "columns"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    unsorted = torch.tensor([[[5, 3]] * 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="sorted strictly"):
        build_vertical_slash_index(unsorted, si, seq_len=300)
    build_vertical_slash_index(unsorted, si, seq_len=300, check_contents=False)
    with pytest.raises(TypeError, match="int32 or torch.int64"):
        build_vertical_slash_index(vi.float(), si, seq_len=300, check_contents=False)
    # vertical_slash_attention passes the choice down when it builds the index itself.
    q, k, v = make_qkv(1, 2, 1, 100, 100, 64, dtype=torch.float32, device="cpu")
    bad_vi = torch.tensor([[[5, 3]] * 2], dtype=torch.int32)
    bad_si = torch.tensor([[[0, 1]] * 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="sorted strictly"):
        vertical_slash_attention(q, k, v, bad_vi, bad_si, impl="reference")
    got = vertical_slash_attention(q, k, v, bad_vi, bad_si, impl="reference", check_indices=False)
    want = vertical_slash_attention(q, k, v, bad_vi.flip(-1), bad_si, impl="reference")
    assert torch.equal(got.out, want.out)  # the same columns, in any order, for the reference


def test_bad_dtype():
    with pytest.raises(TypeError, match="int32 or torch.int64, got torch.float32"):
        _bad(vi=torch.zeros(1, 2, 1))


def test_bad_shape():
    with pytest.raises(
        ValueError, match=r"slash_indices: expected shape \[B=1, H=2, NS\], got \(1, 3, 1\)"
    ):
        _bad(si=torch.zeros(1, 3, 1, dtype=torch.int32))
    with pytest.raises(
        ValueError, match=r"vertical_indices: expected shape \[B=1, H=2, NV\], got \(2, 1\)"
    ):
        _bad(vi=torch.zeros(2, 1, dtype=torch.int32))


def test_bad_block_and_lengths():
    with pytest.raises(NotImplementedError, match="block_n must be one of"):
        _bad(block_n=32)
    q, k, v = make_qkv(1, 2, 1, 50, 100, 64, dtype=torch.float16, device="cpu")
    with pytest.raises(NotImplementedError, match="S_Q == S_KV"):
        _bad(q=q)


def test_bad_index_mismatch():
    vi, si = make_indices(1, 2, 100, 4, 3, device="cpu")
    idx = build_vertical_slash_index(vi, si, seq_len=100, block_m=128)
    with pytest.raises(ValueError, match="index was built for seq_len=100, block_m=128"):
        _bad(index=idx)


# ------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@pytest.mark.parametrize("BM,BN", [(64, 64), (128, 64), (128, 128)], ids=str)
def test_gpu_real_size_bf16(BM, BN):
    _run(1, 28, 4, 4096 + 17, 128, BM, BN, 200, 300, torch.bfloat16, seed=7)


@pytest.mark.gpu
def test_gpu_index_build_on_device_matches_cpu():
    vi, si = make_indices(1, 28, 8192, 500, 700, seed=3, local=64, device="cuda")
    a = build_vertical_slash_index(vi, si, seq_len=8192)
    b = build_vertical_slash_index(vi.cpu(), si.cpu(), seq_len=8192)
    for name in ("range_count", "range_start", "range_end", "column_count", "columns"):
        assert torch.equal(getattr(a, name).cpu(), getattr(b, name)), name


@pytest.mark.gpu
def test_gpu_matches_flex_attention():
    from sparse_kernels.testing import flex_attention_compiled

    B, H, H_KV, S, D = 1, 8, 2, 4096 + 5, 128
    q, k, v = make_qkv(B, H, H_KV, S, S, D, dtype=torch.bfloat16, device="cuda", seed=9)
    vi, si = make_indices(B, H, S, 100, 150, seed=9, local=64, device="cuda")
    idx = build_vertical_slash_index(vi, si, seq_len=S)
    ref = flex_attention_compiled(q, k, v, idx.to_block_mask())
    res = vertical_slash_attention(q, k, v, vi, si, impl="triton", index=idx)
    gold = vertical_slash_attention_reference(q, k, v, vi, si, compute_dtype=torch.float64)
    assert_close_budget(res.out, ref, gold.out, dtype=torch.bfloat16, name="out vs flex")


@pytest.mark.gpu
@pytest.mark.parametrize("BM,BN", [(64, 64), (128, 128)], ids=str)
def test_every_candidate_config_is_correct(BM, BN):
    # A tuned table may name any candidate: each one must compute the same function.
    from sparse_kernels.vertical_slash.triton import SPEC, _launch_vertical_slash_fwd

    S = 3000
    q, k, v = make_qkv(1, 8, 2, S, S, 128, dtype=torch.bfloat16, device="cuda", seed=5)
    vi, si = make_indices(1, 8, S, 100, 150, seed=5, local=64, device="cuda")
    kw = dict(block_m=BM, block_n=BN)
    idx = build_vertical_slash_index(vi, si, seq_len=S, **kw)
    gold = vertical_slash_attention_reference(q, k, v, vi, si, compute_dtype=torch.float64, **kw)
    low = vertical_slash_attention_reference(q, k, v, vi, si, compute_dtype=q.dtype, **kw)
    for cfg in SPEC.candidates:
        out, _ = _launch_vertical_slash_fwd(q, k, v, idx, scale=128**-0.5, config=cfg)
        assert_close_budget(out, low.out, gold.out, dtype=torch.bfloat16, name=str(cfg))
