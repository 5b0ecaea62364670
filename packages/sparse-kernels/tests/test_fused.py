import pytest
import torch
from sparse_kernels.fused import (
    rms_norm,
    rms_norm_reference,
    rotary,
    rotary_reference,
    silu_mul,
    silu_mul_reference,
)
from sparse_kernels.testing import assert_close_budget, default_device, kernel_dtypes

DEV = default_device()


def _rand(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float32) * scale).to(dtype).to(DEV)


def _rms_golden(x, w, eps):
    h = x.double()
    return w.double() * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize(
    "shape",
    [(1, 1, 8), (2, 37, 96), (3, 5, 1000), (1, 4, 3584)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_rms_norm_kernel_within_budget(shape, dtype):
    x = _rand(shape, dtype, seed=shape[-1], scale=3.0)
    w = _rand(shape[-1:], dtype, seed=1) + 1.0
    y = rms_norm(x, w, eps=1e-6, impl="triton")
    assert y.dtype == dtype and y.shape == x.shape
    low = rms_norm_reference(x, w, 1e-6)
    assert_close_budget(y, low, _rms_golden(x, w, 1e-6), dtype=dtype)


def test_references_are_the_formulas():
    """The references (what the kernels are held to) against float64 forms written out here, at
    fp32: relative error of a few fp32 ulps, which a wrong formula cannot meet."""
    x, w = _rand((3, 9, 40), torch.float32, seed=11, scale=2.0), _rand((40,), torch.float32, 12)
    ref = rms_norm_reference(x, w, 1e-6).double()
    assert (
        float(
            (
                (ref - _rms_golden(x, w, 1e-6)).abs()
                / _rms_golden(x, w, 1e-6).abs().clamp_min(1e-3)
            ).max()
        )
        < 1e-5
    )
    g, u = _rand((5, 33), torch.float32, 13, 4.0), _rand((5, 33), torch.float32, 14)
    gold = g.double() / (1 + torch.exp(-g.double())) * u.double()
    assert float((silu_mul_reference(g, u).double() - gold).abs().max()) < 1e-5 * float(
        gold.abs().max()
    )
    q, k, cos, sin = _rope_inputs(1, 3, 1, 21, 16, torch.float32, seed=15)
    rq, rk = rotary_reference(q, k, cos, sin)
    h = 8
    qd, cd, sd = q.double(), cos.double()[:, None], sin.double()[:, None]
    gq = torch.cat([qd[..., :h] * cd[..., :h] - qd[..., h:] * sd[..., :h],
                    qd[..., h:] * cd[..., h:] + qd[..., :h] * sd[..., h:]], -1)  # fmt: skip
    assert float((rq.double() - gq).abs().max()) < 1e-5 and rk.shape == k.shape


def test_rms_norm_promotes_to_the_weight_dtype_and_reads_strided_rows():
    # An fp32 weight on a half input gives fp32, as ``weight * h.to(fp16)`` does in PyTorch.
    x = _rand((6, 64, 80), torch.float16, seed=3)[:, ::2]  # rows 2 apart: not contiguous
    assert not x.is_contiguous()
    w = _rand((80,), torch.float32, seed=4)
    y = rms_norm(x, w, eps=1e-5, impl="triton")
    assert y.dtype == torch.float32
    assert_close_budget(
        y, rms_norm_reference(x, w, 1e-5), _rms_golden(x, w, 1e-5), dtype=torch.float16
    )


def test_rms_norm_zero_row_gives_zero_not_nan():
    x = torch.zeros(2, 64, device=DEV, dtype=torch.float16)
    w = torch.ones(64, device=DEV, dtype=torch.float16)
    y = rms_norm(x, w, eps=1e-6, impl="triton")
    assert torch.equal(y, torch.zeros_like(y))


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize(
    "shape", [(1,), (3, 7), (2, 33, 2051)], ids=lambda s: "x".join(map(str, s))
)
def test_silu_mul_kernel_within_budget(shape, dtype):
    g = _rand(shape, dtype, seed=5, scale=4.0)
    u = _rand(shape, dtype, seed=6)
    y = silu_mul(g, u, impl="triton")
    assert y.dtype == dtype and y.shape == g.shape
    gold = torch.nn.functional.silu(g.double()) * u.double()
    assert_close_budget(y, silu_mul_reference(g, u), gold, dtype=dtype)


def test_silu_mul_reads_views():
    both = _rand((4, 2, 50), torch.float32, seed=7)
    g, u = both[:, 0], both[:, 1]  # interleaved halves of one tensor, as a fused gate_up gives
    y = silu_mul(g, u, impl="triton")
    assert_close_budget(
        y, silu_mul_reference(g, u), torch.nn.functional.silu(g.double()) * u.double()
    )


def _rope_inputs(B, H, H_KV, S, D, dtype, seed):
    """q/k as HF makes them (a ``[B, S, H, D]`` projection seen as ``[B, H, S, D]``) and the
    cos/sin of positions ``0..S-1`` (both halves equal, as HF's rotary embedding gives them)."""
    q = _rand((B, S, H, D), dtype, seed).transpose(1, 2)
    k = _rand((B, S, H_KV, D), dtype, seed + 1).transpose(1, 2)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.arange(S, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat((ang, ang), dim=-1)[None].expand(B, S, D)
    return q, k, emb.cos().to(dtype).to(DEV), emb.sin().to(dtype).to(DEV)


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize(
    "B,H,H_KV,S,D",
    [(1, 4, 2, 33, 128), (2, 7, 1, 70, 64), (1, 2, 2, 5, 80)],
    ids=["B1-H4-HKV2-S33-D128", "B2-H7-HKV1-S70-D64", "B1-H2-HKV2-S5-D80"],
)
def test_rotary_kernel_within_budget(B, H, H_KV, S, D, dtype):
    """Within the rounding budget of the eager form against float64. The kernel asks for the
    eager roundings (each product, then the sum), but the GPU compiler may keep float32 between
    them: on an H100 about a fifth of half-precision outputs differ from eager by one unit in
    the last place (``scripts/rotary_ulps.py``)."""
    q, k, cos, sin = _rope_inputs(B, H, H_KV, S, D, dtype, seed=S)
    qe, ke = rotary(q, k, cos, sin, impl="triton")
    rq, rk = rotary_reference(q, k, cos, sin)
    assert qe.stride() == rq.stride() and ke.shape == k.shape and qe.dtype == dtype
    gq, gk = rotary_reference(q.double(), k.double(), cos.double(), sin.double())
    assert_close_budget(qe, rq, gq, name="q")
    assert_close_budget(ke, rk, gk, name="k")


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_rotary_takes_one_table_for_the_batch(impl):
    """HF builds cos/sin of batch 1 when no position ids are given; they serve every row."""
    q, k, cos, sin = _rope_inputs(3, 2, 1, 19, 32, torch.float32, seed=4)
    one_q, one_k = rotary(q, k, cos[:1], sin[:1], impl=impl)
    full_q, full_k = rotary(q, k, cos, sin, impl=impl)  # _rope_inputs repeats one table
    assert torch.equal(one_q, full_q) and torch.equal(one_k, full_k)


@pytest.mark.gpu
def test_rotary_head_offsets_past_int32():
    """A ``[B, H, S, D]`` q whose head stride times the head index passes 2**31 elements (a
    contiguous q at 1M tokens, D=128: 2**27 per head, 17 heads)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (a 4 GiB buffer)")
    H, S, D, step = 17, 40, 128, 2**27
    base = torch.zeros(step * (H - 1) + S * D, dtype=torch.float16, device="cuda")
    q = base.as_strided((1, H, S, D), (0, step, D, 1))
    q.copy_(_rand((1, H, S, D), torch.float16, seed=21))
    _, k, cos, sin = _rope_inputs(1, 1, 1, S, D, torch.float16, seed=22)
    qe, _ = rotary(q, k, cos, sin, impl="triton")
    rq, _ = rotary_reference(q, k, cos, sin)
    gq, _ = rotary_reference(q.double(), k.double(), cos.double(), sin.double())
    assert_close_budget(qe, rq, gq, name="q")
    del base, q, qe


def test_rotary_promotes_half_inputs_with_fp32_tables():
    q, k, cos, sin = _rope_inputs(1, 2, 1, 17, 32, torch.float16, seed=9)
    qe, ke = rotary(q, k, cos.float(), sin.float(), impl="triton")
    rq, rk = rotary_reference(q, k, cos.float(), sin.float())
    assert qe.dtype == torch.float32 == rq.dtype
    gq, gk = rotary_reference(q.double(), k.double(), cos.double(), sin.double())
    assert_close_budget(qe, rq, gq, dtype=torch.float32)
    assert_close_budget(ke, rk, gk, dtype=torch.float32)


@pytest.mark.parametrize(
    "call,err,match",
    [
        (
            lambda: rms_norm(torch.ones(2, 8), torch.ones(7)),
            ValueError,
            r"expected shape \(8,\).*got weight \(7,\)",
        ),
        (
            lambda: rms_norm(torch.ones(2, 8, dtype=torch.int32), torch.ones(8)),
            TypeError,
            "x: expected dtype",
        ),
        (
            lambda: rms_norm(torch.ones(2, 8), torch.ones(8), eps=float("inf")),
            ValueError,
            "eps: expected a finite float >= 0",
        ),
        (
            lambda: rms_norm(torch.ones(2, 0), torch.ones(0)),
            ValueError,
            r"x: expected a non-empty last dim to normalise, got shape \(2, 0\)",
        ),
        (
            lambda: rms_norm(torch.ones(2, 8), torch.ones(8), impl="fast"),
            ValueError,
            "impl must be one of",
        ),
        (
            lambda: silu_mul(torch.ones(2, 8), torch.ones(2, 7)),
            ValueError,
            r"expected shape \(2, 8\).*got \(2, 7\)",
        ),
        (
            lambda: silu_mul(torch.ones(2), torch.ones(2, dtype=torch.float16)),
            TypeError,
            "up: expected dtype torch.float32",
        ),
        (
            lambda: rotary(*_bad_rope(k=(1, 2, 9, 8))),
            ValueError,
            r"k: expected shape \[1, H_KV, 8, 8\] \(from q\), got \(1, 2, 9, 8\)",
        ),
        (
            lambda: rotary(*_bad_rope(cos=(1, 8, 4))),
            ValueError,
            r"cos: expected shape \(1, 8, 8\) or \(1, 8, 8\), got \(1, 8, 4\)",
        ),
        (lambda: rotary(*_bad_rope(q=(1, 2, 8, 7), k=(1, 1, 8, 7))), ValueError, "even head dim"),
        (
            lambda: silu_mul(torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64)),
            TypeError,
            "gate: expected dtype",
        ),
    ],
)
def test_bad_input_names_expected_and_received(call, err, match):
    with pytest.raises(err, match=match):
        call()


def _bad_rope(q=(1, 2, 8, 8), k=(1, 1, 8, 8), cos=(1, 8, 8)):
    return torch.ones(q), torch.ones(k), torch.ones(cos), torch.ones(cos)
