"""Triangle and A-shape attention, Qwen2.5-VL-7B shape (B=1, H=28, H_KV=4, D=128, bf16): our op
on each engine vs FlexAttention (Triton and FA4 backends) on the same mask and, for the A-shape,
MInference 0.1.6 ``streaming_forward``; FA4 and cuDNN dense causal attention as the dense
baselines.

Configs ``(sink, window, last)``: (8, 512, 128) and (128, 4096, 128). Triangle: row ``i``
attends ``j <= i`` with ``j < sink`` or ``i - j < window``, and the last ``last`` rows attend
every ``j <= i``; the A-shape is the same with ``last = 0`` (what ``streaming_forward(n_init=sink,
n_local=window)`` computes; MInference gets K/V repeated to 28 heads once, outside the timed
call: it has no GQA). Outputs are checked against a float32 oracle (the last 256 rows of two
heads) before timing; useful TFLOP/s counts the mask's pairs, ``ratio_to_fa4_dense`` divides it
by FA4's dense causal rate at the same length (measured once per length in this process).
Run: ``python3 -m pytest packages/sparse-kernels/benchmarks/bench_triangle.py --benchmark-only
-s`` (lengths: ``SPARSE_KERNELS_BENCH_SEQS=32K,128K,512K,1M``; default 32K,128K).
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from sparse_kernels import a_shape_attention, triangle_attention
from sparse_kernels.benchmark_providers import (
    FLEX_RECOMPILE_LIMIT,
    ORACLE_HEADS,
    ORACLE_ROWS,
    PROVIDERS,
    QWEN25_VL_7B,
    REL_TOL,
    ProviderUnavailable,
    causal_rows_mask,
    checked_call,
    fa4_dense_anchor,
    fa4_dense_call,
    flex_call,
    minference_streaming_call,
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
    triangle_pairs,
)
from sparse_kernels.triangle.reference import triangle_mask

pytestmark = pytest.mark.gpu

B, H, H_KV, D = QWEN25_VL_7B
SEQS = bench_seqs(os.environ.get("SPARSE_KERNELS_BENCH_SEQS"))
CONFIGS = {"s8-w512-l128": (8, 512, 128), "s128-w4096-l128": (128, 4096, 128)}
PATTERNS = ["triangle", "a-shape"]
DENSE = ("fa4", "cudnn")  # dense baselines: timed once per length, not the same op
_RESULTS: dict[tuple[str, str], dict] = {}


@functools.cache
def _inputs(S):
    return qwen_inputs(S)


@functools.cache
def _anchor(S):
    return fa4_dense_anchor(*_inputs(S), rep=bench_rounds(S)["rounds"])


@functools.cache
def _flex_mask(S, sink, window, last):
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, i, j):
        return (j <= i) & ((j < sink) | (i - j < window) | (i >= S - last))

    # _compile=True builds the block mask without materialising the S x S mask; one compile per
    # (mask constants, S), more than dynamo's default recompile limit
    with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT):
        return create_block_mask(mask_mod, None, None, S, S, device="cuda", _compile=True)


def _provider(name, q, k, v, sink, window, last):
    if name.startswith("ours-"):
        impl = ours_impl(name)
        if last == 0:
            return lambda: a_shape_attention(q, k, v, sink=sink, window=window, impl=impl).out
        return lambda: (
            triangle_attention(q, k, v, sink=sink, window=window, last=last, impl=impl).out
        )
    if name == "minference" and last:
        raise ProviderUnavailable(
            "minference: streaming_forward computes the A-shape only (no dense last rows)"
        )
    if name == "cudnn" and q.shape[2] > 131072:
        raise ProviderUnavailable("cudnn: dense causal takes seconds per call past 128K")
    require_package(name)
    if name == "fa4":
        return fa4_dense_call(q, k, v)
    if name == "cudnn":
        return cudnn_causal(q, k, v)
    if name == "minference":
        return minference_streaming_call(q, k, v, sink=sink, window=window)
    if name.startswith("flex-"):
        return flex_call(q, k, v, _flex_mask(q.shape[2], sink, window, last), name)
    raise ValueError(name)


def _chosen_config(q: torch.Tensor, k: torch.Tensor, window: int) -> str:
    """The launch config the fused kernel looked up for this call, and where it came from (user
    cache, shipped table, borrowed, nearest entry or safe config)."""
    from sparse_kernels.triangle.triton import SPEC
    from sparse_kernels.triangle.window import window_class
    from sparse_kernels.tuning.lookup import CHOOSER

    choice = CHOOSER.choose(
        SPEC, device=q.device, head_dim=q.shape[-1], dtype=q.dtype,
        group=q.shape[1] // k.shape[1], seq_len=k.shape[2],
        variant=window_class(min(window, k.shape[2])),
    )  # fmt: skip
    return f"{choice.config} ({choice.source})"


@pytest.fixture(scope="module", autouse=True)
def _table(request):
    yield
    title = "triangle / A-shape (bf16, B=1 H=28 H_KV=4 D=128), median ms"
    cases = [f"{s}-{p}-{c}" for s in SEQS for p in PATTERNS for c in CONFIGS]
    # issue 31's targets: triangle 1.3x Flex-on-FA4 on the same mask, A-shape 2x streaming_forward
    targets = {c: ("flex-fa4", 1.3) if "-triangle-" in c else ("minference", 2.0) for c in cases}
    write_summary(request, summary_lines(title, _RESULTS, cases, targets))


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("seq", list(SEQS))
def test_triangle_attention(benchmark, seq, pattern, config, provider):
    S, case = SEQS[seq], f"{seq}-{pattern}-{config}"
    first_case = f"{seq}-{PATTERNS[0]}-{next(iter(CONFIGS))}"
    if provider in DENSE and case != first_case:
        prev = _RESULTS.get((first_case, provider))
        if prev is not None:
            _RESULTS[(case, provider)] = prev
        pytest.skip("dense baseline: timed once per length")
    sink, window, last = CONFIGS[config]
    last = last if pattern == "triangle" else 0
    q, k, v = _inputs(S)
    anchor = _anchor(S)
    dense = provider in DENSE
    mask = triangle_mask(ORACLE_ROWS, S, sink=sink, window=window, last=last, device=q.device)
    rows = causal_rows_mask(S, q.device) if dense else mask.expand(ORACLE_HEADS, -1, -1)
    try:
        fn, err = checked_call(
            provider, lambda: _provider(provider, q, k, v, sink, window, last), q, k, v, rows
        )
    except ProviderUnavailable as e:
        pytest.skip(str(e))
    assert err < REL_TOL, f"{provider}: relative error {err:.2e} on the benchmark shape"
    run_length_benchmark(benchmark, fn, S, profile=provider == "ours-auto")
    flops_dense = attention_flops(B, H, causal_pairs(S, S), D)
    pairs = triangle_pairs(S, sink=sink, window=window, last=last)
    record(
        benchmark,
        flops_dense=flops_dense,
        flops_useful=flops_dense if dense else attention_flops(B, H, pairs, D),
        anchor=anchor,
        provider=provider,
        seq=seq,
        pattern=pattern,
        sink=sink,
        window=window,
        last=last,
        kv_repeated=provider == "minference",
        rel_err=err,
        same_op=not dense,
        config=_chosen_config(q, k, window) if provider == "ours-triton" else None,
    )
    _RESULTS[(case, provider)] = dict(benchmark.extra_info)
