import pytest
import torch
from sparse_kernels import block_sparse_attention
from sparse_kernels.block_sparse import block_mask_to_dense, block_sparse_attention_reference
from sparse_kernels.testing import assert_close_budget, default_device, kernel_dtypes, make_qkv
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

DEV = default_device()


def _lists(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_num_blocks / kv_indices of a ``[B, H, NQB, NKB]`` bool block selection (listed first,
    in a shuffled order so the kernel does not rely on sorted lists)."""
    g = torch.Generator().manual_seed(int(sel.sum()))
    noise = torch.rand(sel.shape, generator=g).to(sel.device)
    order = torch.argsort((~sel).float() * 2 + noise, dim=-1)
    return sel.sum(-1).to(torch.int32), order.to(torch.int32)


def random_block_mask(Bm, Hm, S_Q, S_KV, BM, BN, *, density=0.5, full=True, seed=0, device=DEV):
    """A BlockMask from random partial/full block lists and its block-level selection."""
    nqb, nkb = -(-S_Q // BM), -(-S_KV // BN)
    g = torch.Generator().manual_seed(seed)
    sel = torch.rand(Bm, Hm, nqb, nkb, generator=g) < density
    fsel = sel & (torch.rand(Bm, Hm, nqb, nkb, generator=g) < 0.5) if full else None
    part = sel & ~fsel if full else sel
    pn, pi = _lists(part.to(device))
    if full:
        fn, fi = _lists(fsel.to(device))
        return BlockMask.from_kv_blocks(pn, pi, fn, fi, BLOCK_SIZE=(BM, BN)), sel
    return BlockMask.from_kv_blocks(pn, pi, BLOCK_SIZE=(BM, BN)), sel


def hand_dense(sel, S_Q, S_KV, BM, BN, causal):
    """Element-by-element construction of the attended set (independent of the reference)."""
    Bm, Hm = sel.shape[:2]
    out = torch.zeros(Bm, Hm, S_Q, S_KV, dtype=torch.bool)
    off = S_KV - S_Q
    for b in range(Bm):
        for h in range(Hm):
            for i in range(S_Q):
                for j in range(S_KV):
                    ok = bool(sel[b, h, i // BM, j // BN])
                    if causal:
                        ok = ok and j <= i + off
                    out[b, h, i, j] = ok
    return out


@pytest.mark.parametrize(
    "Bm,Hm,S_Q,S_KV,BM,BN,causal,full",
    [
        pytest.param(1, 1, 97, 97, 64, 64, True, True, id="S97-b64-causal-full+partial"),
        pytest.param(2, 3, 70, 130, 64, 128, True, False, id="SQ70-SKV130-b64x128-causal"),
        pytest.param(1, 2, 150, 100, 128, 64, True, True, id="SQ150-SKV100-b128x64-emptyrows"),
        pytest.param(2, 1, 129, 65, 128, 64, False, True, id="SQ129-SKV65-b128x64-noncausal"),
    ],
)
def test_block_mask_to_dense_matches_hand_built(Bm, Hm, S_Q, S_KV, BM, BN, causal, full):
    bm, sel = random_block_mask(Bm, Hm, S_Q, S_KV, BM, BN, full=full, seed=S_Q, device="cpu")
    dense = block_mask_to_dense(bm, S_Q, S_KV, causal=causal)
    assert torch.equal(dense, hand_dense(sel, S_Q, S_KV, BM, BN, causal))


def test_block_mask_from_create_block_mask_ignores_mask_mod():
    # mask_mod is a sliding window; the op attends the listed blocks in full (causal only).
    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < 100)

    bm = create_block_mask(window, 1, 1, 300, 300, device="cpu", BLOCK_SIZE=(64, 64))
    dense = block_mask_to_dense(bm, 300, 300, causal=True)
    i = torch.arange(300)[:, None]
    j = torch.arange(300)[None, :]
    blocks_touched = (i // 64 * 64 - (j // 64 * 64 + 63) < 100) & (j <= i)
    # A block is listed iff some element of it is in the window: within 100 of the block corner.
    assert torch.equal(dense[0, 0], blocks_touched)
    # The kernel reads create_block_mask's lists (full and partial) the same way.
    q, k, v = make_qkv(1, 2, 1, 300, 300, 64, dtype=torch.float32, device="cpu", seed=8)
    bm = bm.to(DEV)
    q, k, v = q.to(DEV), k.to(DEV), v.to(DEV)
    res = block_sparse_attention(q, k, v, bm, impl="triton")
    gold = block_sparse_attention_reference(q, k, v, bm, compute_dtype=torch.float64)
    low = block_sparse_attention_reference(q, k, v, bm, compute_dtype=q.dtype)
    assert_close_budget(res.out, low.out, gold.out, name="out")


def _run(B, H, H_KV, S_Q, S_KV, D, BM, BN, Bm, Hm, causal, dtype, density=0.5, seed=0):
    q, k, v = make_qkv(B, H, H_KV, S_Q, S_KV, D, dtype=dtype, device=DEV, seed=seed + S_Q)
    bm, _ = random_block_mask(Bm, Hm, S_Q, S_KV, BM, BN, density=density, seed=seed)
    res = block_sparse_attention(q, k, v, bm, causal=causal, impl="triton")
    gold = block_sparse_attention_reference(q, k, v, bm, causal=causal, compute_dtype=torch.float64)
    low = block_sparse_attention_reference(q, k, v, bm, causal=causal, compute_dtype=q.dtype)
    assert res.out.shape == q.shape and res.lse.shape == (B, H, S_Q)
    assert res.out.dtype == q.dtype and res.lse.dtype == torch.float32
    assert_close_budget(res.out, low.out, gold.out, dtype=dtype, name="out")
    assert_close_budget(res.lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")
    return res, bm


# (B, H, H_KV, S_Q, S_KV, D, BM, BN, mask B, mask H, causal)
CASES = [
    pytest.param(1, 2, 2, 1, 1, 64, 64, 64, 1, 2, True, id="S1-b64-perhead"),
    pytest.param(1, 4, 1, 97, 97, 64, 64, 64, 1, 4, True, id="S97-b64-gqa4-perhead"),
    pytest.param(2, 7, 1, 300, 300, 64, 128, 64, 1, 1, True, id="S300-b128x64-gqa7-broadcast"),
    pytest.param(2, 4, 4, 300, 300, 128, 64, 128, 2, 1, False, id="S300-b64x128-D128-noncausal"),
    pytest.param(1, 2, 1, 1025, 1025, 64, 128, 128, 1, 2, True, id="S1025-b128-gqa2"),
    pytest.param(1, 2, 2, 33, 300, 80, 64, 64, 1, 2, True, id="SQ33-SKV300-D80-chunk"),
]


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize("B,H,H_KV,S_Q,S_KV,D,BM,BN,Bm,Hm,causal", CASES)
def test_block_sparse_matches_reference(B, H, H_KV, S_Q, S_KV, D, BM, BN, Bm, Hm, causal, dtype):
    _run(B, H, H_KV, S_Q, S_KV, D, BM, BN, Bm, Hm, causal, dtype)


def test_empty_rows_zero_out_neginf_lse():
    # Causal with S_Q > S_KV: the first rows sit at negative positions; a sparse mask also leaves
    # whole query blocks with no listed block.
    res, bm = _run(1, 2, 1, 200, 90, 64, 64, 64, 1, 2, True, torch.float32, density=0.4, seed=3)
    dense = block_mask_to_dense(bm, 200, 90, causal=True).expand(1, 2, 200, 90)
    empty = ~dense.any(-1)
    assert bool(empty.any())
    assert bool(torch.isneginf(res.lse[empty]).all())
    assert torch.equal(res.out[empty], torch.zeros_like(res.out[empty]))


def test_all_blocks_listed_equals_dense_attention():
    from sparse_kernels import attention

    q, k, v = make_qkv(1, 4, 2, 200, 200, 64, dtype=torch.float32, device=DEV, seed=5)
    nqb, nkb = 4, 2
    num = torch.full((1, 1, nqb), nkb, dtype=torch.int32, device=DEV)
    idx = torch.arange(nkb, dtype=torch.int32, device=DEV).expand(1, 1, nqb, nkb).contiguous()
    bm = BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=(64, 128))
    res = block_sparse_attention(q, k, v, bm, impl="triton")
    dense = attention(q, k, v, impl="triton")
    torch.testing.assert_close(res.out, dense.out, atol=2e-5, rtol=0)
    torch.testing.assert_close(res.lse, dense.lse, atol=2e-5, rtol=0)


# ------------------------------------------------------------------------------------------
# Bad input


def _qkv_mask(BM=64, BN=64, S=130):
    q, k, v = make_qkv(1, 2, 1, S, S, 64, dtype=torch.float16, device="cpu")
    bm, _ = random_block_mask(1, 2, S, S, BM, BN, full=False, device="cpu")
    return q, k, v, bm


def _mk(num, idx, BM=64, BN=64):
    return BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=(BM, BN))


def test_bad_block_size_not_implemented():
    q, k, v, _ = _qkv_mask()
    bm, _ = random_block_mask(1, 2, 130, 130, 32, 64, full=False, device="cpu")
    with pytest.raises(NotImplementedError, match=r"BLOCK_SIZE.*\(32, 64\)"):
        block_sparse_attention(q, k, v, bm, impl="reference")


def test_bad_mask_type():
    q, k, v, _ = _qkv_mask()
    with pytest.raises(TypeError, match="BlockMask, got Tensor"):
        block_sparse_attention(q, k, v, torch.ones(3, 3), impl="reference")


def test_bad_index_dtype():
    q, k, v, bm = _qkv_mask()
    bad = _mk(bm.kv_num_blocks.long(), bm.kv_indices.long())
    with pytest.raises(TypeError, match="int32, got torch.int64"):
        block_sparse_attention(q, k, v, bad, impl="reference")


def test_bad_query_block_count():
    q, k, v, _ = _qkv_mask(S=130)
    num = torch.ones(1, 2, 2, dtype=torch.int32)
    idx = torch.zeros(1, 2, 2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"ceil\(S_Q/BLOCK_M\)=3\], got \(1, 2, 2\)"):
        block_sparse_attention(q, k, v, _mk(num, idx), impl="reference")


def test_bad_head_count():
    q, k, v, _ = _qkv_mask(S=130)
    num = torch.ones(1, 3, 3, dtype=torch.int32)
    idx = torch.zeros(1, 3, 3, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"H' in \{1, 2\}.*got \(1, 3, 3\)"):
        block_sparse_attention(q, k, v, _mk(num, idx), impl="reference")


def test_bad_index_out_of_range():
    q, k, v, _ = _qkv_mask(S=130)
    num = torch.ones(1, 1, 3, dtype=torch.int32)
    idx = torch.zeros(1, 1, 3, 3, dtype=torch.int32)
    idx[0, 0, 1, 0] = 3
    with pytest.raises(
        ValueError, match=r"listed kv blocks.*must lie in \[0, 3\), got values in \[0, 3\]"
    ):
        block_sparse_attention(q, k, v, _mk(num, idx), impl="reference")


def test_unlisted_garbage_indices_are_ignored():
    q, k, v, _ = _qkv_mask(S=130)
    num = torch.ones(1, 1, 3, dtype=torch.int32)
    idx = torch.full((1, 1, 3, 3), 99, dtype=torch.int32)
    idx[..., 0] = 0
    res = block_sparse_attention(q, k, v, _mk(num, idx), impl="reference")
    assert bool(torch.isfinite(res.lse).all())


def test_bad_duplicate_block():
    q, k, v, _ = _qkv_mask(S=130)
    num = torch.full((1, 1, 3), 2, dtype=torch.int32)
    idx = torch.zeros(1, 1, 3, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="listed twice"):
        block_sparse_attention(q, k, v, _mk(num, idx), impl="reference")


def test_bad_impl():
    q, k, v, bm = _qkv_mask()
    with pytest.raises(ValueError, match="impl must be one of"):
        block_sparse_attention(q, k, v, bm, impl="cuda")


# ------------------------------------------------------------------------------------------
# GPU: real sizes, bf16, FlexAttention cross-check


@pytest.mark.gpu
@pytest.mark.parametrize("BM,BN", [(128, 128), (128, 64), (64, 64)], ids=str)
def test_gpu_real_size_bf16(BM, BN):
    _run(1, 28, 4, 4096, 4096, 128, BM, BN, 1, 28, True, torch.bfloat16, density=0.3, seed=11)


@pytest.mark.gpu
def test_gpu_matches_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    B, H, H_KV, S, D, BM, BN = 1, 8, 2, 2048 + 37, 128, 128, 128
    q, k, v = make_qkv(B, H, H_KV, S, S, D, dtype=torch.bfloat16, device="cuda", seed=2)
    nqb, nkb = -(-S // BM), -(-S // BN)
    g = torch.Generator().manual_seed(0)
    keep = (torch.rand(H, nqb, nkb, generator=g) < 0.4).cuda()
    keep |= torch.eye(nqb, nkb, dtype=torch.bool, device="cuda")  # no empty rows

    def mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & keep[h, q_idx // BM, kv_idx // BN]

    bm = create_block_mask(mod, B, H, S, S, device="cuda", BLOCK_SIZE=(BM, BN))
    # With a causal & block-level mask_mod, FlexAttention's attended set is ours.
    ref = torch.compile(flex_attention)(q, k, v, block_mask=bm, enable_gqa=True)
    res = block_sparse_attention(q, k, v, bm, causal=True, impl="triton")
    gold = block_sparse_attention_reference(q, k, v, bm, compute_dtype=torch.float64)
    assert_close_budget(res.out, ref, gold.out, dtype=torch.bfloat16, name="out vs flex")


def _launch_lists(bm):
    return (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices)


def test_launch_config_tiles_must_divide_the_mask_blocks():
    # A tuned table entry for 128-blocks must not run on a 64-block mask: 64 // 128 programs per
    # query block would leave rows unwritten. Refused before any allocation.
    from sparse_kernels.block_sparse.triton import _launch_block_sparse_fwd
    from sparse_kernels.tuning import LaunchConfig

    q, k, v = make_qkv(1, 2, 1, 128, 128, 64, dtype=torch.float16, device="meta", seed=0)
    bm, _ = random_block_mask(1, 1, 128, 128, 64, 64, device="cpu")
    too_big = LaunchConfig.of(TILE_M=128, TILE_N=64, num_warps=8, num_stages=3)
    with pytest.raises(ValueError, match=r"tiles must divide the mask blocks \(64, 64\), got"):
        _launch_block_sparse_fwd(
            q, k, v, *_launch_lists(bm), block_m=64, block_n=64, causal=True, scale=0.125,
            config=too_big,
        )  # fmt: skip


def test_explicit_launch_config_runs():
    # The launcher's config= path (what the tuner and the GPU sweep use), on a 128x128 mask with
    # 64x64 tiles: two programs per query block, two sub-tiles per key block.
    from sparse_kernels.block_sparse.triton import _launch_block_sparse_fwd
    from sparse_kernels.tuning import LaunchConfig

    S = 300
    q, k, v = make_qkv(1, 2, 1, S, S, 64, dtype=torch.float32, device=DEV, seed=4)
    bm, _ = random_block_mask(1, 2, S, S, 128, 128, density=0.6, seed=4)
    cfg = LaunchConfig.of(TILE_M=64, TILE_N=64, num_warps=4, num_stages=1)
    out, lse = _launch_block_sparse_fwd(
        q, k, v, *_launch_lists(bm), block_m=128, block_n=128, causal=True, scale=64**-0.5,
        config=cfg,
    )  # fmt: skip
    gold = block_sparse_attention_reference(q, k, v, bm, compute_dtype=torch.float64)
    low = block_sparse_attention_reference(q, k, v, bm, compute_dtype=q.dtype)
    assert_close_budget(out, low.out, gold.out, name="out")


@pytest.mark.gpu
@pytest.mark.parametrize("BM,BN", [(128, 128), (128, 64), (64, 64)], ids=str)
def test_every_candidate_config_is_correct(BM, BN):
    # A tuned table may name any candidate that fits the mask: each one must compute the same
    # function.
    from sparse_kernels.block_sparse.triton import SPEC, _launch_block_sparse_fwd

    S = 1000
    q, k, v = make_qkv(1, 8, 2, S, S, 128, dtype=torch.bfloat16, device=DEV, seed=7)
    bm, _ = random_block_mask(1, 8, S, S, BM, BN, density=0.4, seed=7)
    gold = block_sparse_attention_reference(q, k, v, bm, compute_dtype=torch.float64)
    low = block_sparse_attention_reference(q, k, v, bm, compute_dtype=q.dtype)
    fitting = SPEC.fitting((BM, BN))
    assert fitting, f"no candidate fits blocks {(BM, BN)}"
    for cfg in fitting:
        out, _ = _launch_block_sparse_fwd(
            q, k, v, *_launch_lists(bm), block_m=BM, block_n=BN, causal=True,
            scale=128**-0.5, config=cfg,
        )  # fmt: skip
        assert_close_budget(out, low.out, gold.out, dtype=torch.bfloat16, name=str(cfg))
