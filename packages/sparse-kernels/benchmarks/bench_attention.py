"""Dense attention: ours vs SDPA (cuDNN, flash) vs FlexAttention, Qwen2.5-7B shape, causal, bf16."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from sparse_kernels import attention
from sparse_kernels.benchmarking import attention_flops, causal_pairs, record, run_benchmark
from torch.nn.attention import SDPBackend, sdpa_kernel

pytestmark = pytest.mark.gpu

SHAPES = {  # name: (B, H, H_KV, S, D)
    "qwen2.5-7b-8K": (1, 28, 4, 8192, 128),
    "qwen2.5-7b-32K": (1, 28, 4, 32768, 128),
    "qwen2.5-7b-128K": (1, 28, 4, 131072, 128),
}
PROVIDERS = ["ours", "sdpa-cudnn", "sdpa-flash", "flex"]


@functools.cache
def _inputs(name):
    B, H, H_KV, S, D = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


def _provider(name, q, k, v):
    if name == "ours":
        return lambda: attention(q, k, v, causal=True).out
    if name.startswith("sdpa"):
        backend = {
            "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
            "sdpa-flash": SDPBackend.FLASH_ATTENTION,
        }[name]
        rep = q.shape[1] // k.shape[1]
        # SDPA's fused backends need equal head counts here; the repeat is outside the timed call.
        kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)

        return run
    if name == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        S = q.shape[2]
        # _compile=True builds the block mask without materialising the S x S mask (128K would OOM).
        bm = create_block_mask(
            lambda b, h, i, j: j <= i, None, None, S, S, device="cuda", _compile=True
        )
        flex = torch.compile(flex_attention, dynamic=False)
        return lambda: flex(q, k, v, block_mask=bm, enable_gqa=True)
    raise ValueError(name)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_dense_attention(benchmark, shape, provider):
    q, k, v = _inputs(shape)
    B, H, H_KV, S, D = SHAPES[shape]
    fn = _provider(provider, q, k, v)
    # Correctness on the benchmark shape before timing (against cuDNN SDPA on a slice of heads).
    out = fn()
    ref = F.scaled_dot_product_attention(
        q[:, :4], k[:, :1].expand(-1, 4, -1, -1), v[:, :1].expand(-1, 4, -1, -1), is_causal=True
    )
    err = ((out[:, :4].float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 2e-2, f"{provider}: relative error {err:.2e} on the benchmark shape"
    del out
    torch.cuda.reset_peak_memory_stats()
    run_benchmark(benchmark, fn, rounds=5 if S >= 131072 else 10)
    flops = attention_flops(B, H, causal_pairs(S, S), D)
    record(
        benchmark,
        flops_dense=flops,
        flops_useful=flops,
        provider=provider,
        shape=shape,
        rel_err=err,
    )
