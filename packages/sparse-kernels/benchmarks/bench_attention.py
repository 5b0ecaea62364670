"""Dense causal attention, Qwen2.5-VL-7B shape (B=1, H=28, H_KV=4, D=128, bf16): our op on each
engine vs FlashAttention-4, FlexAttention (Triton and FA4 backends) and cuDNN SDPA.

Every provider gets the same tensors; its output is checked against a float32 oracle (the last
256 rows of two heads) before it is timed. ``extra_info`` holds useful TFLOP/s and
``ratio_to_fa4_dense`` (FA4's dense rate, measured once per length in this process).
Run: ``python3 -m pytest packages/sparse-kernels/benchmarks/bench_attention.py --benchmark-only -s``
(lengths: ``SPARSE_KERNELS_BENCH_SEQS=32K,128K,512K,1M``; default 32K,128K).
"""

from __future__ import annotations

import functools
import os

import pytest
from sparse_kernels import attention
from sparse_kernels.benchmark_providers import (
    PROVIDERS,
    QWEN25_VL_7B,
    REL_TOL,
    ProviderUnavailable,
    causal_rows_mask,
    checked_call,
    fa4_dense_anchor,
    fa4_dense_call,
    flex_call,
    ours_impl,
    qwen_inputs,
    require_package,
    summary_lines,
    write_summary,
)
from sparse_kernels.benchmarking import (
    attention_flops,
    bench_rounds,
    bench_seqs,
    causal_pairs,
    cudnn_causal,
    record,
    run_length_benchmark,
)

pytestmark = pytest.mark.gpu

B, H, H_KV, D = QWEN25_VL_7B
SEQS = bench_seqs(os.environ.get("SPARSE_KERNELS_BENCH_SEQS"))
_RESULTS: dict[tuple[str, str], dict] = {}


@functools.cache
def _inputs(S):
    return qwen_inputs(S)


@functools.cache
def _anchor(S):
    return fa4_dense_anchor(*_inputs(S), rep=bench_rounds(S)["rounds"])


@functools.cache
def _causal_block_mask(S):
    from torch.nn.attention.flex_attention import create_block_mask

    # _compile=True builds the block mask without materialising the S x S mask (128K would OOM).
    return create_block_mask(
        lambda b, h, i, j: j <= i, None, None, S, S, device="cuda", _compile=True
    )


def _provider(name, q, k, v):
    if name == "minference":
        raise ProviderUnavailable("minference: MInference 0.1.6 has no dense attention op")
    if name.startswith("ours-"):
        impl = ours_impl(name)
        return lambda: attention(q, k, v, causal=True, impl=impl).out
    require_package(name)
    if name == "fa4":
        return fa4_dense_call(q, k, v)
    if name.startswith("flex-"):
        return flex_call(q, k, v, _causal_block_mask(q.shape[2]), name)
    if name == "cudnn":
        return cudnn_causal(q, k, v)
    raise ValueError(name)


@pytest.fixture(scope="module", autouse=True)
def _table(request):
    yield
    title = "dense causal attention (bf16, B=1 H=28 H_KV=4 D=128), median ms"
    # issue 31's target: at least FA4's speed
    targets = {s: ("fa4", 1.0) for s in SEQS}
    write_summary(request, summary_lines(title, _RESULTS, list(SEQS), targets))


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("seq", list(SEQS))
def test_dense_attention(benchmark, seq, provider):
    S = SEQS[seq]
    q, k, v = _inputs(S)
    anchor = _anchor(S)
    try:
        fn, err = checked_call(
            provider, lambda: _provider(provider, q, k, v), q, k, v, causal_rows_mask(S, q.device)
        )
    except ProviderUnavailable as e:
        pytest.skip(str(e))
    assert err < REL_TOL, f"{provider}: relative error {err:.2e} on the benchmark shape"
    run_length_benchmark(benchmark, fn, S, profile=provider == "ours-auto")
    flops = attention_flops(B, H, causal_pairs(S, S), D)
    record(
        benchmark, flops_dense=flops, flops_useful=flops, anchor=anchor,
        provider=provider, seq=seq, shape=f"qwen2.5-vl-7b-{seq}", rel_err=err, same_op=True,
    )  # fmt: skip
    _RESULTS[(seq, provider)] = dict(benchmark.extra_info)
