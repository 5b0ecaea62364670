"""Fused per-token ops vs their eager PyTorch forms (what HF's modules run), on one 32K-token
chunk of the Qwen2.5-VL-7B shape (hidden 3584, MLP 18944, H=28, H_KV=4, D=128), bf16; q/k as HF
makes them (a [B, S, H, D] buffer seen as [B, H, S, D]). Memory-bound: the figure of
merit is GB/s of the bytes each op must move at least (read inputs once, write output once)."""

from __future__ import annotations

import functools

import pytest
import torch
from sparse_kernels.benchmarking import env_info, run_benchmark
from sparse_kernels.fused import (
    rms_norm,
    rms_norm_reference,
    rotary,
    rotary_reference,
    silu_mul,
    silu_mul_reference,
)
from sparse_kernels.testing import assert_close_budget

pytestmark = pytest.mark.gpu

TOKENS, HIDDEN, MLP, H, H_KV, D = 32768, 3584, 18944, 28, 4, 128


@functools.cache
def _inputs():
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
    q = mk(1, TOKENS, H, D).transpose(1, 2)
    k = mk(1, TOKENS, H_KV, D).transpose(1, 2)
    ang = torch.arange(TOKENS, device="cuda")[:, None] * 10000 ** (
        -torch.arange(0, D, 2, device="cuda") / D
    )
    emb = torch.cat((ang, ang), -1)[None]
    cs = (emb.cos().bfloat16(), emb.sin().bfloat16())
    return (mk(1, TOKENS, HIDDEN), mk(HIDDEN) + 1, mk(1, TOKENS, MLP), mk(1, TOKENS, MLP), q, k,
            *cs)  # fmt: skip


def _nbytes(*ts):
    return sum(t.numel() * t.element_size() for t in ts)


OPS = {  # name: (fused, eager, least bytes moved)
    "rms_norm": (
        lambda x, w, g, u, q, k, c, s: lambda: rms_norm(x, w, eps=1e-6),
        lambda x, w, g, u, q, k, c, s: lambda: rms_norm_reference(x, w, 1e-6),
        lambda x, w, g, u, q, k, c, s: 2 * _nbytes(x),
    ),
    "silu_mul": (
        lambda x, w, g, u, q, k, c, s: lambda: silu_mul(g, u),
        lambda x, w, g, u, q, k, c, s: lambda: silu_mul_reference(g, u),
        lambda x, w, g, u, q, k, c, s: 3 * _nbytes(g),
    ),
    "rotary": (
        lambda x, w, g, u, q, k, c, s: lambda: rotary(q, k, c, s)[0],
        lambda x, w, g, u, q, k, c, s: lambda: rotary_reference(q, k, c, s)[0],
        lambda x, w, g, u, q, k, c, s: 2 * _nbytes(q, k) + _nbytes(c, s),
    ),
}


def _golden(op, x, w, g, u, q, k, c, s):
    """The op in float64 (what both the kernel and the eager form are measured against)."""
    if op == "rms_norm":
        return rms_norm_reference(x.double(), w.double(), 1e-6)
    if op == "silu_mul":
        return silu_mul_reference(g.double(), u.double())
    return rotary_reference(q.double(), k.double(), c.double(), s.double())[0]


@pytest.mark.parametrize("provider", ["fused", "eager"])
@pytest.mark.parametrize("op", list(OPS))
def test_fused_op(benchmark, op, provider):
    args = _inputs()
    fused, eager, nbytes = (f(*args) for f in OPS[op])
    if provider == "fused":  # the kernel is within the rounding budget before it is timed
        golden = _golden(op, *args)
        assert_close_budget(fused(), eager(), golden, dtype=torch.bfloat16)
    run_benchmark(benchmark, fused if provider == "fused" else eager, rounds=20)
    med = benchmark.stats.stats.median
    benchmark.extra_info.update(env_info())
    benchmark.extra_info.update(op=op, provider=provider, tokens=TOKENS, median_ms=med * 1e3,
                                min_bytes_gbps=nbytes / med / 1e9)  # fmt: skip
