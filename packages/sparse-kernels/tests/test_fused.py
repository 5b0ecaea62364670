import pytest
import torch
from sparse_kernels.fused import rms_norm, rms_norm_reference, silu_mul, silu_mul_reference
from sparse_kernels.testing import assert_close_budget, default_device, kernel_dtypes

DEV = default_device()


def _rand(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float32) * scale).to(dtype).to(DEV)


def _rms_golden(x, w, eps):
    h = x.double()
    return w.double() * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize(
    "shape",
    [(1, 1, 8), (2, 37, 96), (3, 5, 1000), (1, 4, 3584)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_rms_norm_matches_golden(shape, dtype, impl):
    x = _rand(shape, dtype, seed=shape[-1], scale=3.0)
    w = _rand(shape[-1:], dtype, seed=1) + 1.0
    eps = 1e-6
    y = rms_norm(x, w, eps, impl=impl)
    assert y.dtype == dtype and y.shape == x.shape
    low = rms_norm_reference(x, w, eps)
    assert_close_budget(y, low, _rms_golden(x, w, eps), dtype=dtype)


def test_rms_norm_promotes_to_the_weight_dtype_and_reads_strided_rows():
    # An fp32 weight on a half input gives fp32, as ``weight * h.to(fp16)`` does in PyTorch.
    x = _rand((6, 64, 80), torch.float16, seed=3)[:, ::2]  # rows 2 apart: not contiguous
    assert not x.is_contiguous()
    w = _rand((80,), torch.float32, seed=4)
    y = rms_norm(x, w, 1e-5, impl="triton")
    assert y.dtype == torch.float32
    assert_close_budget(
        y, rms_norm_reference(x, w, 1e-5), _rms_golden(x, w, 1e-5), dtype=torch.float16
    )


def test_rms_norm_zero_row_gives_zero_not_nan():
    x = torch.zeros(2, 64, device=DEV, dtype=torch.float16)
    w = torch.ones(64, device=DEV, dtype=torch.float16)
    y = rms_norm(x, w, 1e-6, impl="triton")
    assert torch.equal(y, torch.zeros_like(y))


@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize(
    "shape", [(1,), (3, 7), (2, 33, 2051)], ids=lambda s: "x".join(map(str, s))
)
def test_silu_mul_matches_golden(shape, dtype, impl):
    g = _rand(shape, dtype, seed=5, scale=4.0)
    u = _rand(shape, dtype, seed=6)
    y = silu_mul(g, u, impl=impl)
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
            lambda: rms_norm(torch.ones(2, 8), torch.ones(8), eps=-1.0),
            ValueError,
            "eps: expected a float >= 0",
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
            lambda: silu_mul(torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64)),
            TypeError,
            "gate: expected dtype",
        ),
    ],
)
def test_bad_input_names_expected_and_received(call, err, match):
    with pytest.raises(err, match=match):
        call()
