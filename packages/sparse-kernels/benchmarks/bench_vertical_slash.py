"""Vertical-slash attention (MInference setting) vs FlexAttention on the same attended set,
vs our dense attention and cuDNN dense SDPA; index build timed on its own.

B=1, H=28, H_KV=4, D=128, bf16, 1000 verticals and 6096 slashes per head, 64x64 tiles.
Synthetic indices (no model here): verticals uniform over ``[0, S)``; slashes = the 64 local
offsets ``0..63`` (the last-64-window diagonals MInference always keeps) plus runs of 64
adjacent offsets starting at log-uniform points of ``[64, S)`` (estimated slashes cluster; spread
out single slashes would each cost a 127-key band per row after block rounding and make the
pattern nearly dense). The attended fraction of the causal pairs is recorded with every timing.
Run: ``nox -s bench -- packages/sparse-kernels/benchmarks/bench_vertical_slash.py``.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from sparse_kernels import attention, build_vertical_slash_index, vertical_slash_attention
from sparse_kernels.benchmarking import (
    attention_flops,
    bench_rounds,
    causal_pairs,
    clustered_vertical_slash_indices,
    cudnn_causal,
    record,
    run_benchmark,
)

pytestmark = pytest.mark.gpu

B, H, H_KV, D = 1, 28, 4, 128
NV, NS, LOCAL = 1000, 6096, 64
RUN = 64  # slashes come in clusters of RUN adjacent offsets (estimated slashes cluster)
BM = BN = 64
ALL_SEQS = {"32K": 32768, "128K": 131072, "512K": 524288, "1M": 1048576}
# SPARSE_KERNELS_BENCH_SEQS=32K,128K,512K,1M picks lengths (default 32K,128K). FlexAttention's
# BlockMask for 64x64 blocks holds [H, S/64, S/64] int32 indices (30 GB at 1M), and our dense
# kernel is timed against cuDNN elsewhere, so both run up to 128K only.
SEQS = {n: ALL_SEQS[n] for n in os.environ.get("SPARSE_KERNELS_BENCH_SEQS", "32K,128K").split(",")}
SMALL_ONLY = {"flex", "dense-ours"}
PROVIDERS = ["index-build", "ours-kernel", "ours-total", "flex", "dense-ours", "sdpa-cudnn"]
_RESULTS: dict[tuple[str, str], dict] = {}


@functools.cache
def _inputs(S):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


@functools.cache
def _indices(S):
    return clustered_vertical_slash_indices(
        B, H, S, NV, NS, local=LOCAL, run=RUN, seed=1, device="cuda"
    )


def _attended_pairs(idx) -> int:
    """Pairs the index computes: range tiles (causal) plus leftover columns (causal), summed
    over (batch, head) in closed form per range, so nothing is ``NQB x NKB`` (1M-token layers)."""
    S, BM, BN = idx.seq_len, idx.block_m, idx.block_n
    dev = idx.range_start.device
    nqb = idx.range_count.shape[-1]
    first = (torch.arange(nqb, device=dev) * BM)[:, None]  # first row of each query block
    last = (torch.clamp((torch.arange(nqb, device=dev) + 1) * BM, max=S) - 1)[:, None]

    def upto(x, w):
        """sum of clamp(t, 0, w) over integers t <= x."""
        x = x.clamp_min(0)
        return torch.where(x <= w, x * (x + 1) // 2, w * (w + 1) // 2 + (x - w) * w)

    R = idx.range_start.shape[-1]
    valid = torch.arange(R, device=dev) < idx.range_count[..., None]
    k0 = idx.range_start.to(torch.int64) * BN
    w = (torch.clamp(idx.range_end.to(torch.int64) * BN, max=S) - k0).clamp_min(0)
    # row i sees clamp(i + 1 - k0, 0, w) keys of the range; summed over the block's rows
    per_range = upto(last + 1 - k0, w) - upto(first - k0, w)
    tile_pairs = int((per_range * valid).sum())
    C = idx.columns.shape[-1]
    cvalid = torch.arange(C, device=dev) < idx.column_count[..., None]
    cols = idx.columns.to(torch.int64)
    col_pairs = (last - torch.maximum(cols, first) + 1).clamp_min(0)
    return tile_pairs + int((col_pairs * cvalid).sum())


@functools.cache
def _setup(seq):
    S = SEQS[seq]
    vert, sl = _indices(S)
    idx = build_vertical_slash_index(vert, sl, seq_len=S, block_m=BM, block_n=BN)
    return idx, _attended_pairs(idx)


def _provider(name, q, k, v, vert, sl, idx):
    kw = dict(block_m=BM, block_n=BN)
    if name == "index-build":
        return lambda: build_vertical_slash_index(vert, sl, seq_len=q.shape[2], **kw)
    if name == "ours-kernel":
        return lambda: vertical_slash_attention(q, k, v, vert, sl, index=idx, **kw).out
    if name == "ours-total":
        return lambda: vertical_slash_attention(q, k, v, vert, sl, **kw).out
    if name == "flex":
        from sparse_kernels.testing import flex_attention_compiled

        bm = idx.to_block_mask()
        return lambda: flex_attention_compiled(q, k, v, bm)
    if name == "dense-ours":
        return lambda: attention(q, k, v, causal=True).out
    if name == "sdpa-cudnn":
        return cudnn_causal(q, k, v)
    raise ValueError(name)


@pytest.fixture(scope="module", autouse=True)
def _table(request):
    yield
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    lines = [
        "vertical_slash (bf16, B=1 H=28 H_KV=4 D=128, NV=1000, NS=6096, 64x64 tiles)",
        f"{'S':>5} {'attended':>8} " + " ".join(f"{p:>12}" for p in PROVIDERS)
        + f" {'build/total':>11} {'flex/ours':>9} {'cudnn/ours':>10}",
    ]  # fmt: skip
    for s in SEQS:
        r = {p: _RESULTS.get((s, p)) for p in PROVIDERS}
        if r["ours-total"] is None:
            continue

        def ms(p, r=r):
            return r[p]["median_ms"] if r[p] else float("nan")

        lines.append(
            f"{s:>5} {r['ours-total']['attended_fraction']:8.3f} "
            + " ".join(f"{ms(p):12.2f}" for p in PROVIDERS)
            + f" {ms('index-build') / ms('ours-total'):11.3f} {ms('flex') / ms('ours-total'):9.2f}"
            + f" {ms('sdpa-cudnn') / ms('ours-total'):10.2f}"
        )  # fmt: skip
    if tr is not None:
        tr.write_line("")
        for line in lines:
            tr.write_line(line)
    else:
        print("\n".join(lines))


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("seq", list(SEQS))
def test_vertical_slash(benchmark, seq, provider):
    S = SEQS[seq]
    if provider in SMALL_ONLY and S > 131072:
        pytest.skip(f"{provider} timed up to 128K only")
    q, k, v = _inputs(S)
    vert, sl = _indices(S)
    idx, pairs = _setup(seq)
    fn = _provider(provider, q, k, v, vert, sl, idx)
    res = fn()
    if provider == "flex":
        ours = vertical_slash_attention(q, k, v, vert, sl, index=idx).out
        err = (res[:, :4].float() - ours[:, :4].float()).norm() / ours[:, :4].float().norm()
        assert err.item() < 2e-2, f"flex vs ours relative error {err.item():.2e}"
        del ours
    del res
    torch.cuda.reset_peak_memory_stats()
    run_benchmark(benchmark, fn, **bench_rounds(S))
    dense_pairs = causal_pairs(S, S)
    sparse = provider in ("ours-kernel", "ours-total", "flex")
    record(
        benchmark,
        flops_dense=attention_flops(B, H, dense_pairs, D),
        # pairs is summed over (batch, head); dense_pairs is per head
        flops_useful=attention_flops(1, 1, pairs, D)
        if sparse
        else attention_flops(B, H, dense_pairs, D),
        provider=provider,
        seq=seq,
        n_vertical=NV,
        n_slash=NS,
        block_m=BM,
        block_n=BN,
        attended_fraction=pairs / (B * H * dense_pairs),
        slash_distribution="0..63 + runs of 64 at log-uniform starts in [64, S)",
    )
    _RESULTS[(seq, provider)] = dict(benchmark.extra_info)
