"""Fused per-token ops vs their eager PyTorch forms (what HF's modules run), on one 32K-token
chunk of the Qwen2.5-VL-7B shape (hidden 3584, MLP 18944), bf16. Memory-bound: the figure of
merit is GB/s of the bytes each op must move at least (read inputs once, write output once)."""

from __future__ import annotations

import functools

import pytest
import torch
from sparse_kernels.benchmarking import env_info, run_benchmark
from sparse_kernels.fused import rms_norm, rms_norm_reference, silu_mul, silu_mul_reference

pytestmark = pytest.mark.gpu

TOKENS, HIDDEN, MLP = 32768, 3584, 18944


@functools.cache
def _inputs():
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
    return mk(1, TOKENS, HIDDEN), mk(HIDDEN) + 1, mk(1, TOKENS, MLP), mk(1, TOKENS, MLP)


OPS = {
    "rms_norm": (
        lambda x, w, g, u: lambda: rms_norm(x, w, 1e-6),
        lambda x, w, g, u: lambda: rms_norm_reference(x, w, 1e-6),
        lambda x, w, g, u: 2 * x.numel() * x.element_size(),
    ),
    "silu_mul": (
        lambda x, w, g, u: lambda: silu_mul(g, u),
        lambda x, w, g, u: lambda: silu_mul_reference(g, u),
        lambda x, w, g, u: 3 * g.numel() * g.element_size(),
    ),
}


@pytest.mark.parametrize("provider", ["fused", "eager"])
@pytest.mark.parametrize("op", list(OPS))
def test_fused_op(benchmark, op, provider):
    args = _inputs()
    fused, eager, nbytes = (f(*args) for f in OPS[op])
    if provider == "fused":  # the kernel agrees with the eager form before it is timed
        got, ref = fused(), eager()
        assert float((got.float() - ref.float()).abs().max()) <= 0.0625 * float(
            ref.float().abs().max()
        )
    run_benchmark(benchmark, fused if provider == "fused" else eager, rounds=20)
    med = benchmark.stats.stats.median
    benchmark.extra_info.update(env_info())
    benchmark.extra_info.update(op=op, provider=provider, tokens=TOKENS, median_ms=med * 1e3,
                                min_bytes_gbps=nbytes / med / 1e9)  # fmt: skip
