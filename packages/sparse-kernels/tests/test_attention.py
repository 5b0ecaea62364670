import pytest
import torch
from sparse_kernels import attention
from sparse_kernels.attention import attention_reference
from sparse_kernels.testing import (
    assert_close_budget,
    default_device,
    kernel_dtypes,
    make_qkv,
    poison_,
)

DEV = default_device()

# (B, H, H_KV, S_Q, S_KV, D, causal)
CASES = [
    pytest.param(1, 2, 2, 1, 1, 64, True, id="B1-H2-HKV2-S1-D64-causal"),
    pytest.param(2, 4, 1, 97, 97, 64, True, id="B2-H4-HKV1-S97-D64-causal-gqa4"),
    pytest.param(1, 7, 1, 97, 97, 80, False, id="B1-H7-HKV1-S97-D80-full-gqa7"),
    pytest.param(1, 2, 2, 1025, 1025, 64, True, id="B1-H2-HKV2-S1025-D64-causal"),
    pytest.param(1, 4, 4, 33, 300, 96, True, id="B1-H4-HKV4-SQ33-SKV300-D96-causal"),
    pytest.param(1, 2, 1, 1, 257, 128, True, id="B1-H2-HKV1-SQ1-SKV257-D128-decode"),
    pytest.param(1, 2, 2, 150, 70, 64, True, id="B1-H2-HKV2-SQ150-SKV70-D64-causal-emptyrows"),
    pytest.param(2, 4, 2, 130, 200, 128, False, id="B2-H4-HKV2-SQ130-SKV200-D128-full"),
    pytest.param(1, 2, 1, 77, 77, 16, True, id="B1-H2-HKV1-S77-D16-causal"),
    pytest.param(1, 2, 2, 90, 90, 40, True, id="B1-H2-HKV2-S90-D40-causal"),
]
GPU_CASES = [
    pytest.param(
        1, 28, 4, 4096, 4096, 128, True, id="B1-H28-HKV4-S4096-D128-causal", marks=pytest.mark.gpu
    ),
    pytest.param(
        2,
        8,
        8,
        2049,
        8192,
        64,
        True,
        id="B2-H8-HKV8-SQ2049-SKV8192-D64-causal",
        marks=pytest.mark.gpu,
    ),
    pytest.param(
        1, 32, 8, 4000, 4000, 96, False, id="B1-H32-HKV8-S4000-D96-full", marks=pytest.mark.gpu
    ),
]


def _check(B, H, H_KV, S_Q, S_KV, D, causal, dtype, layout="bhsd"):
    q, k, v = make_qkv(
        B, H, H_KV, S_Q, S_KV, D, dtype=dtype, device=DEV, seed=S_Q + D, layout=layout
    )
    res = attention(q, k, v, causal=causal, impl="triton")
    gold = attention_reference(q, k, v, causal=causal, compute_dtype=torch.float64)
    low = attention_reference(q, k, v, causal=causal, compute_dtype=q.dtype)
    assert res.out.dtype == q.dtype and res.lse.dtype == torch.float32
    assert res.out.shape == q.shape and res.lse.shape == (B, H, S_Q)
    assert_close_budget(res.out, low.out, gold.out, dtype=dtype, name="out")
    assert_close_budget(res.lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")
    return res


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize("B,H,H_KV,S_Q,S_KV,D,causal", CASES + GPU_CASES)
def test_attention_matches_reference(B, H, H_KV, S_Q, S_KV, D, causal, dtype):
    _check(B, H, H_KV, S_Q, S_KV, D, causal, dtype)


def test_attention_noncontiguous_bshd_layout():
    _check(2, 4, 2, 97, 97, 64, True, torch.float16, layout="bshd")


def test_empty_rows_are_zero_with_neginf_lse():
    # S_Q > S_KV, causal: rows 0..S_Q-S_KV-1 sit at negative positions and see no key.
    q, k, v = make_qkv(1, 2, 2, 150, 70, 64, dtype=torch.float32, device=DEV)
    res = attention(q, k, v, causal=True, impl="triton")
    n_empty = 150 - 70
    assert torch.equal(res.out[:, :, :n_empty], torch.zeros_like(res.out[:, :, :n_empty]))
    assert bool(torch.isneginf(res.lse[:, :, :n_empty]).all())
    assert bool(torch.isfinite(res.lse[:, :, n_empty:]).all())


def test_every_output_element_written():
    q, k, v = make_qkv(1, 2, 1, 97, 97, 80, dtype=torch.float16, device=DEV)
    from sparse_kernels.attention.triton import _launch_attention_fwd

    orig_empty_like = torch.empty_like

    def poisoned(*a, **kw):
        return poison_(orig_empty_like(*a, **kw))

    torch.empty_like = poisoned
    try:
        out, lse = _launch_attention_fwd(q, k, v, causal=True, scale=80**-0.5)
    finally:
        torch.empty_like = orig_empty_like
    assert not bool(out.isnan().any())
    assert not bool(lse.isnan().any())


def test_auto_is_reference_on_cpu_and_triton_on_cuda():
    q, k, v = make_qkv(1, 2, 2, 64, 64, 64, dtype=torch.float32, device=DEV)
    auto = attention(q, k, v)
    want = attention(q, k, v, impl="triton" if DEV.type == "cuda" else "reference")
    assert torch.equal(auto.out, want.out) and torch.equal(auto.lse, want.lse)


def test_reference_matches_sdpa():
    q, k, v = make_qkv(1, 4, 2, 50, 80, 32, dtype=torch.float64, device="cpu")
    ref = attention_reference(q, k, v, causal=False)
    sd = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    )
    torch.testing.assert_close(ref.out, sd)
    # Causal with S_Q == S_KV matches SDPA's is_causal.
    q, k, v = make_qkv(1, 2, 2, 60, 60, 32, dtype=torch.float64, device="cpu")
    ref = attention_reference(q, k, v, causal=True)
    sd = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ref.out, sd)


def test_custom_scale():
    q, k, v = make_qkv(1, 2, 2, 97, 97, 64, dtype=torch.float32, device=DEV)
    res = attention(q, k, v, scale=0.3, impl="triton")
    gold = attention_reference(q, k, v, scale=0.3, compute_dtype=torch.float64)
    low = attention_reference(q, k, v, scale=0.3, compute_dtype=q.dtype)
    assert_close_budget(res.out, low.out, gold.out, dtype=torch.float32)


@pytest.mark.parametrize(
    "make,exc,match",
    [
        pytest.param(
            lambda: (torch.randn(2, 4, 8), torch.randn(2, 4, 8, 64), torch.randn(2, 4, 8, 64)),
            ValueError,
            "4-D",
            id="rank",
        ),
        pytest.param(
            lambda: (torch.randn(2, 4, 8, 64), torch.randn(3, 4, 8, 64), torch.randn(3, 4, 8, 64)),
            ValueError,
            "batch",
            id="batch",
        ),
        pytest.param(
            lambda: (torch.randn(1, 4, 8, 64), torch.randn(1, 4, 8, 32), torch.randn(1, 4, 8, 32)),
            ValueError,
            "head dim",
            id="headdim",
        ),
        pytest.param(
            lambda: (torch.randn(1, 4, 8, 64), torch.randn(1, 3, 8, 64), torch.randn(1, 3, 8, 64)),
            ValueError,
            "H % H_KV",
            id="gqa",
        ),
        pytest.param(
            lambda: (
                torch.randn(1, 4, 8, 64),
                torch.randn(1, 4, 8, 64).half(),
                torch.randn(1, 4, 8, 64),
            ),
            TypeError,
            "one dtype",
            id="mixed-dtype",
        ),
        pytest.param(
            lambda: (torch.randn(1, 4, 8, 64).int(),) * 3, TypeError, "dtype", id="int-dtype"
        ),
        pytest.param(
            lambda: (torch.randn(1, 4, 8, 64), torch.randn(1, 4, 8, 64), torch.randn(1, 4, 9, 64)),
            ValueError,
            "same shape",
            id="kv-shape",
        ),
        pytest.param(
            lambda: (torch.randn(1, 4, 8, 64), torch.randn(1, 4, 8, 64), None),
            TypeError,
            "torch.Tensor",
            id="not-tensor",
        ),
        pytest.param(
            lambda: (
                torch.randn(1, 4, 8, 64, device="meta"),
                torch.randn(1, 4, 8, 64),
                torch.randn(1, 4, 8, 64),
            ),
            ValueError,
            "one device",
            id="devices",
        ),
    ],
)
def test_bad_input(make, exc, match):
    q, k, v = make()
    with pytest.raises(exc, match=match):
        attention(q, k, v)


def test_unsupported_head_dim_names_supported_set():
    q, k, v = make_qkv(1, 2, 2, 16, 16, 160, dtype=torch.float32, device=DEV)
    with pytest.raises(NotImplementedError, match=r"head dims 1\.\.128, got 160"):
        attention(q, k, v, impl="triton")
    # The reference takes any head dim.
    assert attention(q, k, v, impl="reference").out.shape == q.shape


def test_bad_impl_and_scale():
    q, k, v = make_qkv(1, 2, 2, 16, 16, 64, dtype=torch.float32, device=DEV)
    with pytest.raises(ValueError, match="impl must be one of"):
        attention(q, k, v, impl="cuda")
    with pytest.raises(ValueError, match="positive"):
        attention(q, k, v, scale=-1.0)


@pytest.mark.gpu
def test_every_candidate_config_is_correct():
    # A tuned table may name any candidate: each one must compute the same function.
    from sparse_kernels.attention.triton import SPEC, _launch_attention_fwd

    q, k, v = make_qkv(1, 8, 2, 1000, 1000, 128, dtype=torch.bfloat16, device=DEV, seed=7)
    gold = attention_reference(q, k, v, compute_dtype=torch.float64)
    low = attention_reference(q, k, v, compute_dtype=q.dtype)
    for cfg in SPEC.candidates:
        out, _ = _launch_attention_fwd(q, k, v, causal=True, scale=128**-0.5, config=cfg)
        assert_close_budget(out, low.out, gold.out, dtype=torch.bfloat16, name=str(cfg))


@pytest.mark.parametrize("op", ["attention", "triangle"])
def test_key_offsets_past_int32_are_refused(op):
    # A [B, S, H_KV, D] tensor seen as [B, H_KV, S, D] (HF's transpose) with 32 KV heads at 512K:
    # the key row offset (S - 1) * H_KV * D passes 2**31. Meta tensors: shapes only, no memory.
    from sparse_kernels.attention.triton import _launch_attention_fwd
    from sparse_kernels.triangle.triton import _launch_triangle_fwd

    S, H_KV, D = 2**19 + 1, 32, 128
    q = torch.empty(1, H_KV, 16, D, device="meta", dtype=torch.float16)
    wide = torch.empty(1, S, H_KV, D, device="meta", dtype=torch.float16).transpose(1, 2)
    with pytest.raises(
        ValueError, match=r"k offsets within one \(batch, KV head\) must stay below"
    ):
        if op == "attention":
            _launch_attention_fwd(q, wide, wide, causal=True, scale=1.0)
        else:
            _launch_triangle_fwd(q, wide, wide, sink=4, window=8, last=0, scale=1.0)
    # The same sizes contiguous ([B, H_KV, S, D]) pass the check.
    from sparse_kernels._validate import check_int32_key_offsets

    flat = torch.empty(1, H_KV, S, D, device="meta", dtype=torch.float16)
    check_int32_key_offsets(flat, flat, op)
    with pytest.raises(ValueError, match="v offsets"):
        check_int32_key_offsets(flat, wide, op)
