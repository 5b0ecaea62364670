import pytest
import torch
from sparse_kernels import attention, merge_attention
from sparse_kernels.attention import attention_reference, masked_attention_reference
from sparse_kernels.merge import merge_attention_reference
from sparse_kernels.testing import assert_close_budget, default_device, kernel_dtypes, make_qkv

DEV = default_device()


def _split_keys(S_KV: int, n: int, seed: int) -> list[torch.Tensor]:
    """A random partition of the keys into n disjoint (not contiguous) sets, some possibly empty."""
    g = torch.Generator().manual_seed(seed)
    owner = torch.randint(0, n, (S_KV,), generator=g)
    return [owner == i for i in range(n)]


@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize(
    "B,H,H_KV,S_Q,S_KV,D,n",
    [
        pytest.param(1, 2, 2, 1, 40, 64, 2, id="S1-n2"),
        pytest.param(2, 4, 1, 97, 97, 64, 3, id="S97-n3-gqa4"),
        pytest.param(1, 7, 1, 33, 1025, 80, 4, id="SKV1025-n4-gqa7"),
    ],
)
def test_merge_equals_attention_over_union(B, H, H_KV, S_Q, S_KV, D, n, dtype, impl):
    q, k, v = make_qkv(B, H, H_KV, S_Q, S_KV, D, dtype=dtype, device=DEV, seed=n)
    scale = D**-0.5
    parts = [
        masked_attention_reference(
            q, k, v, m.to(DEV)[None, :].expand(S_Q, S_KV), scale=scale, compute_dtype=torch.float64
        )
        for m in _split_keys(S_KV, n, seed=S_Q)
    ]
    outs = [p.out.to(dtype) for p in parts]
    lses = [p.lse for p in parts]
    res = merge_attention(outs, lses, impl=impl)
    gold = attention_reference(q, k, v, causal=False, compute_dtype=torch.float64)
    low = merge_attention_reference(outs, lses, compute_dtype=dtype)
    assert res.out.dtype == dtype
    assert_close_budget(res.out, low.out, gold.out, dtype=dtype)
    assert_close_budget(res.lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-4, name="lse")


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_merge_of_kernel_halves_equals_full_kernel(impl):
    # Causal split: keys [0, 64) and [64, 128) for 128 queries; the second half leaves rows < 64 empty.
    q, k, v = make_qkv(1, 4, 2, 128, 128, 64, dtype=torch.float32, device=DEV)
    full = attention(q, k, v, causal=True, impl="triton")
    a = attention(q, k[:, :, :64], v[:, :, :64], causal=False, impl="triton")
    # Row i sees keys 64..i of the second half: a causal call on rows 64.. with S_KV = i+1-64.
    b_rows = attention(q[:, :, 64:], k[:, :, 64:], v[:, :, 64:], causal=True, impl="triton")
    b_out = torch.zeros_like(a.out)
    b_lse = torch.full_like(a.lse, float("-inf"))
    b_out[:, :, 64:] = b_rows.out
    b_lse[:, :, 64:] = b_rows.lse
    a_out = a.out.clone()
    a_lse = a.lse.clone()
    # Rows < 64 see only keys <= i of the first half: use the causal kernel for them.
    first = attention(q[:, :, :64], k[:, :, :64], v[:, :, :64], causal=True, impl="triton")
    a_out[:, :, :64] = first.out
    a_lse[:, :, :64] = first.lse
    res = merge_attention([a_out, b_out], [a_lse, b_lse], impl=impl)
    torch.testing.assert_close(res.out, full.out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res.lse, full.lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
def test_merge_empty_rows_never_nan(impl, dtype):
    out = torch.randn(1, 2, 5, 64, device=DEV).to(dtype)
    lse = torch.randn(1, 2, 5, device=DEV)
    lse[:, :, 2] = float("-inf")
    out[:, :, 2] = 0
    out2 = torch.zeros_like(out)
    lse2 = torch.full_like(lse, float("-inf"))
    res = merge_attention([out, out2], [lse, lse2], impl=impl)
    assert not bool(res.out.isnan().any()) and not bool(res.lse.isnan().any())
    assert torch.equal(res.out[:, :, 2], torch.zeros_like(res.out[:, :, 2]))
    assert bool(torch.isneginf(res.lse[:, :, 2]).all())
    # A part with lse = -inf contributes nothing: the other rows are the first part.
    keep = [0, 1, 3, 4]
    torch.testing.assert_close(res.out[:, :, keep], out[:, :, keep])
    torch.testing.assert_close(res.lse[:, :, keep], lse[:, :, keep])


def test_merge_bad_input():
    o = torch.randn(1, 2, 5, 64)
    x = torch.randn(1, 2, 5)
    with pytest.raises(ValueError, match="as many lses"):
        merge_attention([o, o], [x])
    with pytest.raises(ValueError, match="at least one"):
        merge_attention([], [])
    with pytest.raises(TypeError, match="float32"):
        merge_attention([o], [x.double()])
    with pytest.raises(ValueError, match=r"expected shape \(1, 2, 5\)"):
        merge_attention([o], [torch.randn(1, 2, 6)])
    with pytest.raises(ValueError, match=r"expected shape \(1, 2, 5, 64\)"):
        merge_attention([o, torch.randn(1, 2, 5, 32)], [x, x])
    with pytest.raises(TypeError, match="sequences"):
        merge_attention(o, x)
