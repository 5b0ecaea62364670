"""Triangle attention (sink 8, window 512, last 128): ours vs FlexAttention (same mask) vs cuDNN dense."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from sparse_kernels import triangle_attention
from sparse_kernels.benchmarking import attention_flops, causal_pairs, record, run_benchmark
from sparse_kernels.triangle import triangle_attention_reference
from torch.nn.attention import SDPBackend, sdpa_kernel

pytestmark = pytest.mark.gpu

SINK, WINDOW, LAST = 8, 512, 128
SHAPES = {  # name: (B, H, H_KV, S, D)
    "qwen2.5-7b-32K": (1, 28, 4, 32768, 128),
    "qwen2.5-7b-128K": (1, 28, 4, 131072, 128),
    "qwen2.5-7b-512K": (1, 28, 4, 524288, 128),
    "qwen2.5-7b-1M": (1, 28, 4, 1048576, 128),
    "llama3.1-8b-32K": (1, 32, 8, 32768, 128),
    "llama3.1-8b-64K": (1, 32, 8, 65536, 128),
    "llama3.1-8b-128K": (1, 32, 8, 131072, 128),
}
PROVIDERS = ["ours", "flex", "cudnn-dense"]


@functools.cache
def _inputs(name):
    B, H, H_KV, S, D = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return mk(H), mk(H_KV), mk(H_KV)


def _useful_pairs(S: int) -> int:
    dense_rows = min(LAST, S)
    a_rows = S - dense_rows
    # A-shape rows: min(i+1, window) local keys plus the sink keys outside the window.
    local = (
        sum(min(i + 1, WINDOW) for i in range(min(a_rows, WINDOW)))
        + max(0, a_rows - WINDOW) * WINDOW
    )
    sink_extra = max(0, a_rows - WINDOW) * SINK
    dense = causal_pairs(S, S) - causal_pairs(a_rows, a_rows)
    return local + sink_extra + dense


def _provider(name, q, k, v):
    S = q.shape[2]
    if name == "ours":
        return lambda: triangle_attention(q, k, v, sink=SINK, window=WINDOW, last=LAST).out
    if name == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def mask_mod(b, h, i, j):
            return (j <= i) & ((j < SINK) | (i - j < WINDOW) | (i >= S - LAST))

        bm = create_block_mask(mask_mod, None, None, S, S, device="cuda", _compile=True)
        flex = torch.compile(flex_attention, dynamic=False)
        return lambda: flex(q, k, v, block_mask=bm, enable_gqa=True)
    if name == "cudnn-dense":
        rep = q.shape[1] // k.shape[1]
        kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

        def run():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)

        return run
    raise ValueError(name)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_triangle_attention(benchmark, shape, provider):
    B, H, H_KV, S, D = SHAPES[shape]
    if provider == "cudnn-dense" and S > 131072:
        pytest.skip("cuDNN dense at 512K/1M takes seconds to minutes per call; see the table note")
    q, k, v = _inputs(shape)
    fn = _provider(provider, q, k, v)
    err = float("nan")
    if provider != "cudnn-dense":
        # Correctness on the benchmark shape: the last 256 rows (dense + A-shape) of 2 heads vs the reference.
        out = fn()
        r0 = S - 256
        ref = triangle_attention_reference(
            q[:, :2, r0:],
            k[:, :1],
            v[:, :1],
            sink=SINK,
            window=WINDOW,
            last=LAST,
            compute_dtype=torch.float32,
        ).out
        got = out[:, :2, r0:].float()
        err = ((got - ref.float()).norm() / ref.float().norm()).item()
        assert err < 2e-2, f"{provider}: relative error {err:.2e}"
        del out
    torch.cuda.reset_peak_memory_stats()
    run_benchmark(benchmark, fn, rounds=10 if S <= 131072 else 5)
    dense = attention_flops(B, H, causal_pairs(S, S), D)
    useful = attention_flops(B, H, _useful_pairs(S), D) if provider != "cudnn-dense" else dense
    record(
        benchmark,
        flops_dense=dense,
        flops_useful=useful,
        provider=provider,
        shape=shape,
        rel_err=err,
        config=_chosen_config(q, k) if provider == "ours" else None,
    )


def _chosen_config(q: torch.Tensor, k: torch.Tensor) -> str:
    """The launch config the fused kernel looked up for this call, and where it came from (user
    cache, shipped table, nearest entry or safe config)."""
    from sparse_kernels.triangle.triton import SPEC
    from sparse_kernels.tuning.lookup import CHOOSER

    choice = CHOOSER.choose(
        SPEC, device=q.device, head_dim=q.shape[-1], dtype=q.dtype,
        group=q.shape[1] // k.shape[1], seq_len=k.shape[2],
    )  # fmt: skip
    return f"{choice.config} ({choice.source})"
