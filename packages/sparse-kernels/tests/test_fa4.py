"""The FlashAttention-4 engine (``impl="fa4"``): what it refuses, and on a GPU with the
``hopper`` extra, the same error budgets against float64 as the Triton kernels."""

import pytest
import torch
from sparse_kernels import (
    attention,
    block_sparse_attention,
    fa4,
    merge_attention,
    triangle_attention,
    vertical_slash_attention,
)
from sparse_kernels.attention import attention_reference
from sparse_kernels.block_sparse import block_mask_to_dense, block_sparse_attention_reference
from sparse_kernels.testing import assert_close_budget, default_device, make_qkv
from sparse_kernels.validation import resolve_impl
from torch.nn.attention.flex_attention import BlockMask

DEV = default_device()
FA4_DTYPES = [torch.float16, torch.bfloat16]
needs_fa4 = pytest.mark.skipif(
    not fa4.available(), reason=f"needs flash-attn-4 ({fa4.EXTRA_HINT}) and an sm90 GPU"
)


def _block_mask(Bm, Hm, S_Q, S_KV, BM, BN, *, density, seed, device, full=True):
    """Random partial/full lists, each row's entries in a shuffled order (FA4 must not rely on
    sorted lists)."""
    nqb, nkb = -(-S_Q // BM), -(-S_KV // BN)
    g = torch.Generator().manual_seed(seed)
    sel = torch.rand(Bm, Hm, nqb, nkb, generator=g) < density
    fsel = sel & (torch.rand(Bm, Hm, nqb, nkb, generator=g) < 0.5) if full else sel & False

    def lists(s):
        order = torch.argsort((~s).float() * 2 + torch.rand(s.shape, generator=g), dim=-1)
        return s.sum(-1).to(torch.int32).to(device), order.to(torch.int32).to(device)

    pn, pi = lists(sel & ~fsel)
    fn, fi = lists(fsel)
    return BlockMask.from_kv_blocks(pn, pi, fn, fi, BLOCK_SIZE=(BM, BN))


# ------------------------------------------------------------------------------------------
# Refusals: named, before any launch (CPU)


def test_fa4_refuses_cpu_tensors_naming_the_device():
    q, k, v = make_qkv(1, 2, 1, 64, 64, 64, dtype=torch.float16, device="cpu")
    with pytest.raises(ValueError, match=r"attention: impl='fa4' needs CUDA tensors, got .*cpu"):
        attention(q, k, v, impl="fa4")


@pytest.mark.parametrize(
    "dtype,D,match",
    [
        (torch.float32, 64, r"needs float16 or bfloat16 tensors, got torch.float32"),
        (torch.float16, 12, r"head dim in 8..256 divisible by 8, got 12"),
        (torch.bfloat16, 264, r"head dim in 8..256 divisible by 8, got 264"),
    ],
)
def test_fa4_refuses_dtype_and_head_dim(dtype, D, match):
    q, k, v = make_qkv(1, 2, 1, 16, 16, D, dtype=dtype, device="meta")
    with pytest.raises(NotImplementedError, match=match):
        attention(q, k, v, impl="fa4")


def test_fa4_block_lists_refusals():
    bm = _block_mask(1, 1, 256, 300, 128, 128, density=0.5, seed=0, device="cpu")
    q, k, v = make_qkv(1, 2, 1, 256, 300, 64, dtype=torch.float16, device="cpu")
    with pytest.raises(NotImplementedError, match=r"S_KV=300, block_n=128"):
        block_sparse_attention(q, k, v, bm, causal=False, impl="fa4")
    q, k, v = make_qkv(1, 2, 1, 256, 300, 192, dtype=torch.float16, device="cpu")
    with pytest.raises(NotImplementedError, match=r"up to head dim 128, got 192"):
        block_sparse_attention(q, k, v, bm, impl="fa4")


def test_ops_without_an_fa4_kernel_say_so():
    o, lse = torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8)
    with pytest.raises(NotImplementedError, match=r"merge_attention: impl='fa4': .*no kernel"):
        merge_attention([o, o], [lse, lse], impl="fa4")


def test_fa4_vertical_slash_refusals():
    q, k, v = make_qkv(1, 2, 1, 128, 128, 64, dtype=torch.float16, device="cpu")
    vi = torch.tensor([[[3], [5]]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"vertical_slash_attention: impl='fa4' needs CUDA"):
        vertical_slash_attention(q, k, v, vi, vi, impl="fa4")
    q, k, v = make_qkv(1, 2, 1, 128, 128, 192, dtype=torch.float16, device="meta")
    vi = vi.to("meta")
    with pytest.raises(NotImplementedError, match=r"up to head dim 128, got 192"):
        vertical_slash_attention(q, k, v, vi, vi, impl="fa4")


def test_fa4_triangle_refuses_head_dims_over_128():
    q, k, v = make_qkv(1, 2, 1, 64, 64, 192, dtype=torch.float16, device="cpu")
    with pytest.raises(
        NotImplementedError, match=r"triangle attention up to head dim 128 .*, got 192"
    ):
        triangle_attention(q, k, v, sink=16, window=16, last=16, impl="fa4")


def test_auto_off_cuda_is_the_reference_and_never_fa4():
    assert resolve_impl("auto", torch.device("cpu"), "attention", fa4=lambda: None) == "reference"


def test_auto_table_names_only_ops_with_an_fa4_path():
    ops = {
        "attention",
        "block_sparse_attention",
        "triangle_attention",
        "vertical_slash_attention",
    }
    block_ops = {"block_sparse_attention", "vertical_slash_attention"}
    for op, major, dtype, head_dim, variant in fa4.AUTO_FA4:
        assert op in ops and major in fa4.support.ARCH_MAJORS
        assert dtype in fa4.support.DTYPES and head_dim % fa4.support.HEAD_DIM_STEP == 0
        # block-list ops are keyed by their block size, the triangle by its window class, the
        # others by none
        if op in block_ops:
            assert all(b in fa4.support.BLOCK_SIZES for b in variant)
        elif op == "triangle_attention":
            assert variant in ("narrow", "wide")
        else:
            assert variant is None
    q = torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16)
    assert not fa4.auto_prefers("attention", q)  # off CUDA, never


def test_auto_table_variants_in_words():
    from sparse_kernels.__main__ import _variant_words

    assert _variant_words(None) == ""
    assert _variant_words((128, 64)) == ", 128x64 blocks"
    assert _variant_words("wide") == ", wide windows"


@pytest.mark.skipif(fa4.support.import_problem() is None, reason="flash-attn-4 is installed here")
def test_missing_package_names_the_extra():
    from sparse_kernels.__main__ import _fa4_line

    assert not fa4.available()
    assert fa4.EXTRA_HINT in fa4.support.import_problem()
    assert fa4.version() is None
    line = _fa4_line()  # what python -m sparse_kernels prints
    assert line.startswith("unavailable: flash-attn-4 is not importable") and fa4.EXTRA_HINT in line


# ------------------------------------------------------------------------------------------
# GPU with the extra: the Triton test matrix, error budgets against float64

# (B, H, H_KV, S_Q, S_KV, D, causal)
DENSE_CASES = [
    (1, 2, 2, 1, 1, 64, True),
    (2, 4, 1, 97, 97, 64, True),
    (1, 7, 1, 97, 97, 80, False),
    (1, 4, 4, 33, 300, 96, True),
    (1, 2, 1, 1, 257, 128, True),
    (1, 2, 2, 150, 70, 64, True),
    (2, 4, 2, 130, 200, 128, False),
    (1, 2, 2, 90, 90, 40, True),
    (1, 28, 4, 4096, 4096, 128, True),
    (2, 8, 8, 2049, 8192, 64, True),
    (1, 4, 2, 1000, 1000, 256, True),
]


@pytest.mark.gpu
@needs_fa4
@pytest.mark.parametrize("dtype", FA4_DTYPES, ids=str)
@pytest.mark.parametrize("B,H,H_KV,S_Q,S_KV,D,causal", DENSE_CASES, ids=str)
def test_fa4_dense_matches_reference(B, H, H_KV, S_Q, S_KV, D, causal, dtype):
    q, k, v = make_qkv(B, H, H_KV, S_Q, S_KV, D, dtype=dtype, device="cuda", seed=S_Q + D)
    res = attention(q, k, v, causal=causal, impl="fa4")
    gold = attention_reference(q, k, v, causal=causal, compute_dtype=torch.float64)
    low = attention_reference(q, k, v, causal=causal, compute_dtype=q.dtype)
    assert res.out.shape == q.shape and res.lse.shape == (B, H, S_Q)
    assert res.out.dtype == q.dtype and res.lse.dtype == torch.float32
    assert_close_budget(res.out, low.out, gold.out, dtype=dtype, name="out")
    assert_close_budget(res.lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")


# (B, H, H_KV, S_Q, S_KV, D, BM, BN, mask B, mask H, causal)
SPARSE_CASES = [
    (1, 4, 1, 97, 97, 64, 64, 64, 1, 4, True),
    (2, 7, 1, 300, 300, 64, 128, 64, 1, 1, True),
    (2, 4, 4, 256, 384, 128, 64, 128, 2, 1, False),
    (1, 2, 1, 1025, 1025, 64, 128, 128, 1, 2, True),
    (1, 2, 2, 33, 300, 80, 64, 64, 1, 2, True),
    (1, 2, 1, 200, 90, 64, 64, 64, 1, 2, True),
    (1, 28, 4, 4096, 4096, 128, 128, 128, 1, 28, True),
]


@pytest.mark.gpu
@needs_fa4
@pytest.mark.parametrize("dtype", FA4_DTYPES, ids=str)
@pytest.mark.parametrize("B,H,H_KV,S_Q,S_KV,D,BM,BN,Bm,Hm,causal", SPARSE_CASES, ids=str)
def test_fa4_block_sparse_matches_reference(
    B, H, H_KV, S_Q, S_KV, D, BM, BN, Bm, Hm, causal, dtype
):
    q, k, v = make_qkv(B, H, H_KV, S_Q, S_KV, D, dtype=dtype, device="cuda", seed=S_Q)
    bm = _block_mask(Bm, Hm, S_Q, S_KV, BM, BN, density=0.4, seed=S_Q + BM, device="cuda")
    res = block_sparse_attention(q, k, v, bm, causal=causal, impl="fa4")
    gold = block_sparse_attention_reference(q, k, v, bm, causal=causal, compute_dtype=torch.float64)
    low = block_sparse_attention_reference(q, k, v, bm, causal=causal, compute_dtype=q.dtype)
    assert res.out.shape == q.shape and res.lse.shape == (B, H, S_Q)
    assert_close_budget(res.out, low.out, gold.out, dtype=dtype, name="out")
    assert_close_budget(res.lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")
    # Rows that attend nothing (no listed block, or above the diagonal): out 0, lse -inf.
    empty = ~block_mask_to_dense(bm, S_Q, S_KV, causal=causal).expand(B, H, S_Q, S_KV).any(-1)
    assert torch.equal(res.out[empty], torch.zeros_like(res.out[empty]))
    assert bool(torch.isneginf(res.lse[empty]).all())


@pytest.mark.gpu
@needs_fa4
def test_fa4_block_sparse_without_full_lists():
    # A BlockMask made from partial lists only has no full lists at all (None).
    q, k, v = make_qkv(1, 4, 2, 1000, 1000, 128, dtype=torch.bfloat16, device="cuda", seed=3)
    both = _block_mask(1, 4, 1000, 1000, 128, 128, density=0.5, seed=3, device="cuda", full=False)
    bm = BlockMask.from_kv_blocks(both.kv_num_blocks, both.kv_indices, BLOCK_SIZE=(128, 128))
    assert bm.full_kv_num_blocks is None
    res = block_sparse_attention(q, k, v, bm, impl="fa4")
    gold = block_sparse_attention_reference(q, k, v, bm, compute_dtype=torch.float64)
    low = block_sparse_attention_reference(q, k, v, bm, compute_dtype=q.dtype)
    assert_close_budget(res.out, low.out, gold.out, dtype=torch.bfloat16, name="out")


@pytest.mark.gpu
@needs_fa4
def test_fa4_dense_empty_rows_zero_out_neginf_lse():
    q, k, v = make_qkv(1, 2, 2, 150, 70, 64, dtype=torch.bfloat16, device="cuda")
    res = attention(q, k, v, causal=True, impl="fa4")
    n_empty = 150 - 70
    assert torch.equal(res.out[:, :, :n_empty], torch.zeros_like(res.out[:, :, :n_empty]))
    assert bool(torch.isneginf(res.lse[:, :, :n_empty]).all())


@pytest.mark.gpu
@needs_fa4
def test_auto_runs_the_table_engine_and_triton_for_what_fa4_cannot():
    q, k, v = make_qkv(1, 4, 2, 512, 512, 128, dtype=torch.bfloat16, device="cuda")
    want = "fa4" if fa4.auto_prefers("attention", q) else "triton"
    assert torch.equal(attention(q, k, v, impl="auto").out, attention(q, k, v, impl=want).out)
    q32, k32, v32 = (t.float() for t in (q, k, v))  # fp32: FA4 cannot, auto is triton
    auto = attention(q32, k32, v32, impl="auto")
    assert torch.equal(auto.out, attention(q32, k32, v32, impl="triton").out)
    # Block-list ops are keyed by block size: vertical-slash runs FA4 at 128x128, Triton at 64x64
    # (sm90, bf16, D=128).
    assert fa4.auto_prefers("vertical_slash_attention", q, (128, 128))
    assert not fa4.auto_prefers("vertical_slash_attention", q, (64, 64))
    vi, si = _vs_indices(1, 4, 512, 20, 30, seed=1, device="cuda")
    for bs, want in ((64, "triton"), (128, "fa4")):
        kw = dict(block_m=bs, block_n=bs)
        auto = vertical_slash_attention(q, k, v, vi, si, impl="auto", **kw)
        assert torch.equal(auto.out, vertical_slash_attention(q, k, v, vi, si, impl=want, **kw).out)
    # The triangle is keyed by window class: Triton up to 1024 keys, FA4 above (sm90, bf16, D=128).
    assert fa4.auto_prefers("triangle_attention", q, "wide")
    assert not fa4.auto_prefers("triangle_attention", q, "narrow")
    q, k, v = make_qkv(1, 4, 2, 2048, 2048, 128, dtype=torch.bfloat16, device="cuda")
    for window, want in ((512, "triton"), (2048, "fa4")):
        kw = dict(sink=8, window=window, last=64)
        auto = triangle_attention(q, k, v, impl="auto", **kw)
        assert torch.equal(auto.out, triangle_attention(q, k, v, impl=want, **kw).out)


# (B, H, H_KV, S_Q, S_KV, D, sink, window, last)
TRIANGLE_CASES = [
    (1, 4, 1, 300, 300, 64, 8, 64, 16),
    (2, 4, 2, 257, 400, 128, 40, 100, 0),
    (1, 2, 2, 200, 90, 64, 16, 32, 8),
    (1, 4, 4, 1000, 1000, 96, 1, 1, 1),
    (1, 28, 4, 4096, 4096, 128, 128, 1024, 128),
    (1, 28, 4, 4096, 4096, 128, 8, 512, 128),
]


@pytest.mark.gpu
@needs_fa4
@pytest.mark.parametrize("dtype", FA4_DTYPES, ids=str)
@pytest.mark.parametrize("B,H,H_KV,S_Q,S_KV,D,sink,window,last", TRIANGLE_CASES, ids=str)
def test_fa4_triangle_matches_reference(B, H, H_KV, S_Q, S_KV, D, sink, window, last, dtype):
    from sparse_kernels.triangle import triangle_attention_reference

    q, k, v = make_qkv(B, H, H_KV, S_Q, S_KV, D, dtype=dtype, device="cuda", seed=S_Q + sink)
    shape = dict(sink=sink, window=window, last=last)
    res = triangle_attention(q, k, v, **shape, impl="fa4")
    gold = triangle_attention_reference(q, k, v, **shape, compute_dtype=torch.float64)
    low = triangle_attention_reference(q, k, v, **shape, compute_dtype=q.dtype)
    assert res.out.shape == q.shape and res.lse.shape == (B, H, S_Q)
    assert_close_budget(res.out, low.out, gold.out, dtype=dtype, name="out")
    assert_close_budget(res.lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")


def _stand_in_flash_attn(monkeypatch):
    """A plain-PyTorch ``flash_attn.cute`` with the two calls the triangle and vertical-slash
    engines make (FA4's sliding window; its block-sparse kernel over partial-block lists, causal),
    ``[B, S, H, D]`` in and out, so that the engines' splits run here."""
    import sys
    import types
    from collections import namedtuple

    from sparse_kernels.attention import masked_attention_reference

    def flash_attn_func(
        q, k, v, *, softmax_scale, causal, return_lse, window_size=None, block_sparse_tensors=None
    ):
        assert return_lse and (window_size is None) != (block_sparse_tensors is None)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        S_Q, S_KV = q.shape[2], k.shape[2]
        p = torch.arange(S_Q, device=q.device)[:, None] + (S_KV - S_Q)
        j = torch.arange(S_KV, device=q.device)[None, :]
        if window_size is not None:
            assert not causal and window_size[1] == 0
            mask = (j <= p) & (p - j <= window_size[0])
        else:
            t = block_sparse_tensors
            assert causal
            BM, BN = t.block_size
            nkb = -(-S_KV // BN)
            dev = q.device
            tiles = torch.zeros(*t.mask_block_cnt.shape, nkb + 1, dtype=torch.bool, device=dev)
            for cnt, idx in ((t.mask_block_cnt, t.mask_block_idx),
                             (t.full_block_cnt, t.full_block_idx)):  # fmt: skip
                listed = torch.arange(idx.shape[-1], device=dev) < cnt[..., None]
                tiles.scatter_(-1, torch.where(listed, idx.long(), nkb), True)
            tiles = tiles[..., :nkb].repeat_interleave(BM, -2).repeat_interleave(BN, -1)
            mask = tiles[..., :S_Q, :S_KV] & (j <= p)
        res = masked_attention_reference(q, k, v, mask, scale=softmax_scale)
        return res.out.transpose(1, 2).contiguous(), res.lse

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = flash_attn_func
    sparsity = types.ModuleType("flash_attn.cute.block_sparsity")
    sparsity.BlockSparseTensorsTorch = namedtuple(
        "BlockSparseTensorsTorch",
        "mask_block_cnt mask_block_idx full_block_cnt full_block_idx block_size",
    )
    pkg = types.ModuleType("flash_attn")
    pkg.cute = cute
    cute.block_sparsity = sparsity
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    monkeypatch.setitem(sys.modules, "flash_attn.cute.block_sparsity", sparsity)


@pytest.mark.parametrize(
    "S_Q,S_KV,sink,window,last",
    [(150, 150, 8, 32, 16), (120, 70, 16, 8, 8), (97, 200, 40, 50, 0), (64, 64, 64, 64, 64)],
    ids=str,
)
def test_triangle_engine_split_is_exact(monkeypatch, S_Q, S_KV, sink, window, last):
    """Window (FA4's part, a stand-in here) + sink merge + split-K last rows = the pattern."""
    from sparse_kernels.fa4.triangle import triangle
    from sparse_kernels.triangle import triangle_attention_reference

    _stand_in_flash_attn(monkeypatch)
    q, k, v = make_qkv(1, 4, 2, S_Q, S_KV, 64, dtype=torch.float32, device=DEV, seed=S_Q)
    shape = dict(sink=sink, window=window, last=last, scale=0.125)
    res = triangle(q, k, v, **shape)
    gold = triangle_attention_reference(q, k, v, **shape, compute_dtype=torch.float64)
    low = triangle_attention_reference(q, k, v, **shape)
    assert_close_budget(res.out, low.out, gold.out, dtype=torch.float32, name="out")
    assert_close_budget(res.lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")


@pytest.mark.parametrize(
    "S,BM,BN,NV,NS",
    [(150, 64, 64, 9, 5), (300, 128, 64, 20, 7), (257, 64, 128, 0, 12), (200, 64, 64, 30, 0)],
    ids=str,
)
def test_vertical_slash_engine_split_is_exact(monkeypatch, S, BM, BN, NV, NS):
    """Range tiles (FA4's part, a stand-in here) + columns merged in place = the pattern."""
    from sparse_kernels import build_vertical_slash_index
    from sparse_kernels.fa4.vertical_slash import vertical_slash
    from sparse_kernels.vertical_slash import vertical_slash_attention_reference

    _stand_in_flash_attn(monkeypatch)
    q, k, v = make_qkv(1, 4, 2, S, S, 64, dtype=torch.float32, device=DEV, seed=S)
    vi, si = _vs_indices(1, 4, S, NV, NS, seed=S)
    kw = dict(block_m=BM, block_n=BN)
    res = vertical_slash(q, k, v, build_vertical_slash_index(vi, si, seq_len=S, **kw), scale=0.125)
    gold = vertical_slash_attention_reference(
        q, k, v, vi, si, scale=0.125, compute_dtype=torch.float64, **kw
    )
    low = vertical_slash_attention_reference(q, k, v, vi, si, scale=0.125, **kw)
    assert_close_budget(res.out, low.out, gold.out, dtype=torch.float32, name="out")
    assert_close_budget(res.lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")
    empty = torch.isneginf(gold.lse)
    assert bool(torch.isneginf(res.lse[empty]).all())


def _vs_indices(B, H, S, NV, NS, *, seed, device=DEV):
    """Sorted distinct verticals; slashes: the first 4 local offsets, the rest random."""
    g = torch.Generator().manual_seed(seed)

    def rows(n, first):
        out = []
        for _ in range(B * H):
            rest = torch.randperm(S - first, generator=g)[: max(n - first, 0)] + first
            out.append(torch.cat([torch.arange(min(first, n)), rest]).sort().values)
        return torch.stack(out).reshape(B, H, -1).to(torch.int32).to(device)

    return rows(NV, 0), rows(NS, 4)


# (B, H, H_KV, S, D, BM, BN, NV, NS)
VS_CASES = [
    (1, 4, 1, 97, 64, 64, 64, 5, 8),
    (2, 7, 1, 300, 128, 128, 64, 10, 7),
    (1, 2, 2, 300, 80, 64, 128, 12, 9),
    (1, 2, 1, 1025, 64, 128, 128, 0, 40),
    (1, 2, 1, 400, 64, 64, 64, 20, 0),
    (1, 28, 4, 4096 + 17, 128, 64, 64, 200, 300),
    (1, 28, 4, 4096, 128, 128, 128, 200, 300),
]


@pytest.mark.gpu
@needs_fa4
@pytest.mark.parametrize("dtype", FA4_DTYPES, ids=str)
@pytest.mark.parametrize("B,H,H_KV,S,D,BM,BN,NV,NS", VS_CASES, ids=str)
def test_fa4_vertical_slash_matches_reference(B, H, H_KV, S, D, BM, BN, NV, NS, dtype):
    from sparse_kernels.vertical_slash import vertical_slash_attention_reference

    q, k, v = make_qkv(B, H, H_KV, S, S, D, dtype=dtype, device="cuda", seed=S + NV)
    vi, si = _vs_indices(B, H, S, NV, NS, seed=S, device="cuda")
    kw = dict(block_m=BM, block_n=BN)
    res = vertical_slash_attention(q, k, v, vi, si, impl="fa4", **kw)
    gold = vertical_slash_attention_reference(q, k, v, vi, si, compute_dtype=torch.float64, **kw)
    low = vertical_slash_attention_reference(q, k, v, vi, si, compute_dtype=q.dtype, **kw)
    assert res.out.shape == q.shape and res.lse.shape == (B, H, S)
    assert_close_budget(res.out, low.out, gold.out, dtype=dtype, name="out")
    assert_close_budget(res.lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")
    empty = torch.isneginf(gold.lse)
    assert torch.equal(res.out[empty], torch.zeros_like(res.out[empty]))
    assert bool(torch.isneginf(res.lse[empty]).all())
